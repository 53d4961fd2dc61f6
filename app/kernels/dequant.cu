// W4/W3 -> fp16 dequantization of weight rows (the GEMM prefill's reused tile buffer, and the
// embedding lookup of a decode step or prefill chunk: ids non-null, output row n = weight row ids[n]).
// Layouts: the runtime's tile layouts (app/kernels/w4_tiles.py, w3_tiles.py), any row range.
// W4: one thread per packed word writes 8 fp16 (one 16-byte store); W3: one thread per row
// and 32 inputs reads its 3 words and writes 32.
// fp16(q * scale): the product is exact in fp32, one rounding - bit-equal to app.quant.

// Pair (k, k+1) of a word as half2: the even k in the low half-word, the odd one in the high.
__device__ __forceinline__ half2_t dequant_pair(int even, int odd, int offset, float s) {
    return float2_to_half2((float)(even - offset) * s, (float)(odd - offset) * s);
}

// The weight row of output row n: ids[n] (token ids, which the previous kernel may have written:
// read after the wait), or start + n.
__device__ __forceinline__ long long weight_row(const int* ids, long long start, long long n) {
    if (ids == nullptr) return start + n;
    pdl_wait();
    return ids[n];
}

// W4 tile layout (app/kernels/w4_tiles.py: [tile][group][h][lane][4 words]), rows
// start..start+rows-1 -> out [rows, K] fp16; thread i = output word i (k = 8j .. 8j+7 of its row).
extern "C" __global__ void dequant_w4_tiles_kernel(const unsigned* __restrict__ tiles,
                                                   const half_t* __restrict__ scales,
                                                   half_t* __restrict__ out, long long start, long long words,
                                                   int groups, const int* __restrict__ ids) {
    pdl_launch_dependents();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= words) return;
    const int words_per_row = 16 * groups;
    const long long r = weight_row(ids, start, i / words_per_row);
    const int j = (int)(i % words_per_row), grp = j >> 4, t = (j >> 2) & 3;
    const int slot = (int)(r & 15);
    const long long lane_vec = (((r >> 4) * groups + grp) * 2 + (slot >> 3)) * 32 + 4 * (slot & 7) + t;
    const unsigned w = tiles[4 * lane_vec + (j & 3)];
    const float s = h2f(scales[r * groups + grp]);
    unsigned v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)  // nibble m: k = 8j + 2m; nibble 4 + m: k = 8j + 2m + 1
        v[m] = dequant_pair((w >> (4 * m)) & 15, (w >> (16 + 4 * m)) & 15, 8, s);
    pdl_wait();  // out may still be read by the previous kernel (the last GEMM)
    reinterpret_cast<uint4*>(out)[i] = make_uint4(v[0], v[1], v[2], v[3]);
}

// W3 tile layout (app/kernels/w3_tiles.py: a [N, K/16], b [N, K/32], N % 16 == 0), rows
// start..start+rows-1 -> out [rows, K]; thread i = (row, group, t): 3 words -> k = 128 group + 32t .. +31.
extern "C" __global__ void dequant_w3_tiles_kernel(const unsigned* __restrict__ a,
                                                   const unsigned* __restrict__ b,
                                                   const half_t* __restrict__ scales,
                                                   half_t* __restrict__ out, long long start, long long threads,
                                                   int groups, const int* __restrict__ ids) {
    pdl_launch_dependents();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= threads) return;
    const long long r = weight_row(ids, start, i / (4 * groups));
    const int grp = (int)((i / 4) % groups), t = (int)(i & 3);
    const int slot = (int)(r & 15), g = slot & 7, h = slot >> 3;
    const long long at = ((r >> 4) * groups + grp) * 32 + 4 * g + t;  // the GEMV lane's vector index
    const unsigned w[3] = {a[4 * at + 2 * h], a[4 * at + 2 * h + 1], b[2 * at + h]};
    const float s = h2f(scales[r * groups + grp]);
    unsigned v[16];
#pragma unroll
    for (int p = 0; p < 15; ++p) {  // pair p: k = 32t + 2p (low half-word), + 1 (high)
        const unsigned wp = w[p / 5];
        const int f = 3 * (p % 5);
        v[p] = dequant_pair((wp >> f) & 7, (wp >> (16 + f)) & 7, 4, s);
    }
    int even = 0, odd = 0;
#pragma unroll
    for (int j = 0; j < 3; ++j) {  // pair 15: bit j in the sign bits of word j
        even |= ((w[j] >> 15) & 1) << j;
        odd |= ((w[j] >> 31) & 1) << j;
    }
    v[15] = dequant_pair(even, odd, 4, s);
    pdl_wait();
    uint4* dst = reinterpret_cast<uint4*>(out) + 4 * i;
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = make_uint4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}
