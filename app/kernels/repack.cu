// Checkpoint layout -> the GEMV's tile layouts, once per weight at load time (app/kernels/repack.py).
// Layouts: docs/FORMATS.md (checkpoint: row-major words) and app/kernels/w4_tiles.py, w3_tiles.py
// (tiles of 16 rows x 128 inputs; lane l = 4g + t of a tile reads rows g and g + 8, inputs
// 32t .. 32t + 31 of the group). One thread per (tile, group, lane) and row pair: it reads its
// rows' words from the checkpoint layout and writes the lane's words of the tile layout into a
// separate buffer (the caller copies that back over the checkpoint bytes: in place, by chunks).
// Integer moves only: bit-equal to the PyTorch repack.

// The stored value u (0..7) of pair p (0..15), parity par (0: even k, 1: odd k) of 32 inputs,
// from their checkpoint words: qlow lo0 (k 0..15), lo1 (k 16..31) and the qhigh word hi.
__device__ __forceinline__ unsigned w3_stored(unsigned lo0, unsigned lo1, unsigned hi, int p, int par) {
    const unsigned lo = p < 8 ? lo0 : lo1;
    const unsigned low2 = (lo >> (2 * (p & 7) + 16 * par)) & 3u;
    const unsigned high = (hi >> (p + 16 * par)) & 1u;
    return low2 | (high << 2);
}

// The three tile-layout words W0..W2 of one row's 32 inputs (bit map: app/kernels/w3_tiles.py):
// pairs 5w .. 5w + 4 in 3-bit fields of word w (even k in the low half-word, odd k in the high),
// bit w of pair 15 in bit 15 / 31 of word w.
__device__ __forceinline__ void w3_tile_words(unsigned lo0, unsigned lo1, unsigned hi, unsigned out[3]) {
#pragma unroll
    for (int w = 0; w < 3; ++w) {
        unsigned word = 0;
#pragma unroll
        for (int f = 0; f < 5; ++f) {
            word |= w3_stored(lo0, lo1, hi, 5 * w + f, 0) << (3 * f);
            word |= w3_stored(lo0, lo1, hi, 5 * w + f, 1) << (16 + 3 * f);
        }
        word |= ((w3_stored(lo0, lo1, hi, 15, 0) >> w) & 1u) << 15;
        word |= ((w3_stored(lo0, lo1, hi, 15, 1) >> w) & 1u) << 31;
        out[w] = word;
    }
}

// W3: qlow [rows, K/16], qhigh [rows, K/32] (rows % 16 == 0) -> a [rows, K/16], b [rows, K/32] in
// the tile layout: a = [tile][group][lane][h][W0 W1], b = [tile][group][lane][h] (W2).
extern "C" __global__ void repack_w3_tiles_kernel(const unsigned* __restrict__ qlow,
                                                  const unsigned* __restrict__ qhigh,
                                                  unsigned* __restrict__ a, unsigned* __restrict__ b,
                                                  long long lanes, int groups) {
    pdl_launch_dependents();
    pdl_wait();  // the previous chunk's copy back may still be writing these bytes
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // (tile, group, lane)
    if (i >= lanes) return;
    const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
    const long long tile_group = i >> 5;
    const int group = (int)(tile_group % groups);
    const long long tile = tile_group / groups;
    unsigned words[2][3];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const long long row = 16 * tile + 8 * h + g;
        const unsigned* lo = qlow + row * (8LL * groups) + 8 * group + 2 * t;
        w3_tile_words(lo[0], lo[1], qhigh[row * (4LL * groups) + 4 * group + t], words[h]);
    }
    reinterpret_cast<uint4*>(a)[i] = make_uint4(words[0][0], words[0][1], words[1][0], words[1][1]);
    reinterpret_cast<uint2*>(b)[i] = make_uint2(words[0][2], words[1][2]);
}

// W4: qweight [rows, K/8] (rows % 16 == 0, 16-byte aligned) -> the tile layout
// [tile][group][h][lane][4 words]: the lane's 4 words (k = 128 group + 32t .. + 31) of row
// 16 tile + 8h + g, bits unchanged. Thread i = one 16-byte vector of the output.
extern "C" __global__ void repack_w4_tiles_kernel(const uint4* __restrict__ qweight, uint4* __restrict__ out,
                                                  long long vectors, int groups) {
    pdl_launch_dependents();
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // (tile, group, h, lane)
    if (i >= vectors) return;
    const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
    const int h = (int)((i >> 5) & 1);
    const long long tile_group = i >> 6;
    const int group = (int)(tile_group % groups);
    const long long row = 16 * (tile_group / groups) + 8 * h + g;
    out[i] = qweight[row * (4LL * groups) + 4 * group + t];  // a row holds 4 vectors per group
}
