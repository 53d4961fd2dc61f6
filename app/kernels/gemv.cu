// Quantized GEMV for decode: y[M, N] = x[M, K] @ W[N, K]^T with W in the tile layouts the
// runtime repacks W4 and W3 into at load time (app/kernels/w4_tiles.py, w3_tiles.py: whole
// 16-row tiles, a warp's loads contiguous), fp16 activations, fp32 accumulation, M <= 8 (16 with COLS = 2).
//
// Work split. A warp owns TILES tiles of 16 weight rows; inside a tile the 32 lanes form 8
// teams of 4 (lane = 4*g + t): team g loads rows g and g+8, lane t the 32 inputs
// 32t..32t+31 of every group of 128. That is exactly the A operand of the tensor-core
// instruction mma.m16n8k16 (row g / g+8, k-slot pairs 2t.. and 2t+8..) once we decide which
// real k each k-slot stands for: in mma step s (0..7) lane t's slots (2t, 2t+1) hold its
// input pair 2s and slots (2t+8, 2t+9) its pair 2s+1. The B operand (x) uses the same
// mapping, column n = batch row g. So one group of 128 inputs x 16 rows is 8 mma steps, the
// scale is applied per group in fp32, and a batch of up to 8 rows costs the same as one
// (rows 9..16: a second block of mma columns, COLS = 2).
//
// Batch invariance: column m of an mma depends only on A and column m of B, every other
// loop is independent of M, so row m of a batched call is bit-equal to a batch-1 call.
//
// The warps of a block share the same rows and split the groups into ksplit slices (slice w
// takes groups w, w + ksplit, ...; one slice per warp, two per warp only in the 16-row
// instances of a 32-slice split), then add the slices' partial sums through shared memory
// in a fixed order.
// Gated with TILES == 1 ("split" gate/up): even warps take the gate tile, odd warps the up
// tile of the same 16 outputs (groups split among the warps of one parity), so a warp holds
// one tile's registers and the block still owns both halves for the SiLU epilogue.
// Each warp keeps two stages of weights in registers: the loads of the next UNROLL groups
// are issued before the math of the current ones, so every warp has two sets of loads in
// flight (latency, not bandwidth, limits a GEMV on a big GPU). Dequantization costs about
// one instruction per weight (LOP3 with the magic number + one f16x2 sub or fma per pair;
// W3 a little more for its 16th pair).
//
// Staged x (STAGE_X, the launcher's choice when M * K fp16 is at most 4 KB: batch 1 of the
// 3B shapes): each block copies x into shared memory once, right after the wait, and its warps
// read x from there instead of through L1 beside the streaming weight loads (docs/KERNELS.md
// § GEMV). The values are the same: results are bit-identical either way.
//
// Fused RMSNorm (batch 1, staged x; docs/KERNELS.md § Fused norms): a residual GEMV (o, down) can
// leave the chunk sums of squares of the rows it writes in sums_out (common.cu's order), and
// the next GEMV (qkv, gate/up, head) can then take that residual row h itself as x with
// norm_w / norm_sums: it stages fp16(w * fp16(h * inv)), the norm kernel's exact output, with
// 1/rms from a few loads and a shuffle tree instead of a norm kernel and its dependent launch.
//
// Preloaded weights (PRELOAD, SM90+ with programmatic launches; the gate/up where its grid fits
// one wave, docs/KERNELS.md § Preloaded weights): every group a warp walks is copied into shared memory
// with cp.async before the wait, while the attention block before it runs; bit-identical
// results for the same split.
//
// Epilogue rounding matches the unfused PyTorch path exactly: y = fp16(acc + bias), then
// fp16(y + residual); gated: fp16(silu(fp16(gate))) * fp16(up) rounded to fp16.

constexpr int GROUP = 128;
constexpr int MAX_KSPLIT = 32;  // K slices of a block (gemv.py MAX_WARPS)
extern __shared__ uint4 x_stage[];  // STAGE_X: x [M][K / 8] (dynamic shared memory)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool EARLY_RESIDUAL_ARCH = true;
#else
constexpr bool EARLY_RESIDUAL_ARCH = false;
#endif

__device__ __forceinline__ unsigned u4_get(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// What lane t of row team g holds for one tile (its rows g and g + 8) and one group.
template <int BITS> struct Frag;
template <> struct Frag<4> { uint4 r[2]; };          // row g (r[0]), g + 8 (r[1]): k = 32t .. 32t+31
template <> struct Frag<3> { uint4 a; uint2 b; };    // tile layout (w3_tiles.py): row g a.x a.y b.x, g + 8 a.z a.w b.y

// Where one lane's tile starts (group 0), with the group offset added per load (32-bit):
// one pointer per weight tensor, one to row g's scales and the distance to row g + 8's.
template <int BITS> struct TilePtr;
template <> struct TilePtr<4> { const uint4* w; const half_t* s; int ds; };
template <> struct TilePtr<3> { const uint4* a; const uint2* b; const half_t* s; int ds; };

// The lane's first 16-byte vector in tile `first_row / 16` (W4: [tile][group][h][lane]
// vectors; W3: [tile][group][lane] in a and in b). Group g is +64 (W4) or +32 vectors later.
// Scales are per row as in the checkpoint; row0 / row1 are the lane's rows g / g + 8.
__device__ __forceinline__ TilePtr<4> tile_ptr(TilePtr<4>, const unsigned* qa, const unsigned*, const half_t* scales,
                                               long row0, long row1, long first_row, int K, int lane) {
    return {reinterpret_cast<const uint4*>(qa) + (first_row / 16) * (K / GROUP) * 64 + lane,
            scales + row0 * (K / GROUP), (int)(row1 - row0) * (K / GROUP)};
}

__device__ __forceinline__ TilePtr<3> tile_ptr(TilePtr<3>, const unsigned* qa, const unsigned* qb, const half_t* scales,
                                               long row0, long row1, long first_row, int K, int lane) {
    const long at = (first_row / 16) * (K / GROUP) * 32 + lane;
    return {reinterpret_cast<const uint4*>(qa) + at, reinterpret_cast<const uint2*>(qb) + at,
            scales + row0 * (K / GROUP), (int)(row1 - row0) * (K / GROUP)};
}

// SM90 (programmatic launches): while the previous kernel finishes, ask L2 for the weight
// lines of every group this warp walks after its first stage, and for its rows' scales, so
// the loads after pdl_wait() find them there. W4: 1 KB per tile and group, W3: 512 + 256 B.
__device__ __forceinline__ void prefetch_groups(const TilePtr<4>& p, int lane, int first, int stride, int groups) {
    const uint4* tile = p.w - lane;
    const int n = first < groups ? (groups - first + stride - 1) / stride : 0;  // this warp's groups
    for (int i = lane; i < 8 * n; i += 32) {
        const int grp = first + (i >> 3) * stride;
        prefetch_l2(tile + grp * 64 + (i & 7) * 8);
    }
}

__device__ __forceinline__ void prefetch_groups(const TilePtr<3>& p, int lane, int first, int stride, int groups) {
    const uint4* a = p.a - lane;
    const uint2* b = p.b - lane;
    const int n = first < groups ? (groups - first + stride - 1) / stride : 0;
    for (int i = lane; i < 8 * n; i += 32) {
        const int grp = first + (i >> 3) * stride, line = i & 7;
        if (line < 6)  // lines 0-3: a (512 B), 4-5: b (256 B)
            prefetch_l2(line < 4 ? (const void*)(a + grp * 32 + line * 8) : (const void*)(b + grp * 32 + (line - 4) * 16));
    }
}

// Loads are volatile asm so they stay at the top of the stage in source order: the whole
// stage's weights are in flight together, one stage ahead of the mma that consumes them.
__device__ __forceinline__ void load_frag(Frag<4>& f, const TilePtr<4>& p, int group) {
    f.r[0] = load_streaming_16(p.w + group * 64);
    f.r[1] = load_streaming_16(p.w + group * 64 + 32);
}

__device__ __forceinline__ void load_frag(Frag<3>& f, const TilePtr<3>& p, int group) {
    f.a = load_streaming_16(p.a + group * 32);
    f.b = load_streaming_8(p.b + group * 32);
}

// Preloaded weights (PRELOAD, docs/KERNELS.md § Preloaded weights): before the wait every lane copies
// its fragments of all the groups its warp walks into shared memory with cp.async, and reads
// them back after the wait. Slot s (warp, group index i, tile j) holds what load_frag would
// have loaded: W4 two 16-byte vectors per lane ([s][2][32] uint4), W3 a 16-byte vector
// ([s][32] uint4) and an 8-byte one (after all nslots a vectors: [s][32] uint2). Each lane
// reads only its own copies, so no barrier is needed between copy and use.
__device__ __forceinline__ void preload_frag(const TilePtr<4>& p, int group, uint4* region, int slot, int, int lane) {
    cp_async_16(region + (2 * slot) * 32 + lane, p.w + group * 64);
    cp_async_16(region + (2 * slot + 1) * 32 + lane, p.w + group * 64 + 32);
}

__device__ __forceinline__ void preload_frag(const TilePtr<3>& p, int group, uint4* region, int slot, int nslots,
                                             int lane) {
    cp_async_16(region + slot * 32 + lane, p.a + group * 32);
    cp_async_8(reinterpret_cast<uint2*>(region + nslots * 32) + slot * 32 + lane, p.b + group * 32);
}

__device__ __forceinline__ void read_frag(Frag<4>& f, const uint4* region, int slot, int, int lane) {
    f.r[0] = region[(2 * slot) * 32 + lane];
    f.r[1] = region[(2 * slot + 1) * 32 + lane];
}

__device__ __forceinline__ void read_frag(Frag<3>& f, const uint4* region, int slot, int nslots, int lane) {
    f.a = region[slot * 32 + lane];
    f.b = reinterpret_cast<const uint2*>(region + nslots * 32)[slot * 32 + lane];
}

// (a & b) | c in one LOP3 (the compiler emits two when both constants are immediates).
__device__ __forceinline__ unsigned and_or(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ half2_t hfma2(half2_t a, half2_t b, half2_t c) {
    half2_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// The pairs 2S and 2S + 1 of one W4 row (half2 of the signed integers q, exact). Pair p holds
// the nibbles at bit 4(p & 3) of each 16-bit half of word p / 4. Magic number: 0x6400 is
// fp16 1024, so OR-ing a nibble u into its mantissa gives 1024 + u (bits 0-3) or 1024 + 16u
// (bits 4-7); the second kind is scaled by 1/16 in the same fma that subtracts 64 + 8, so no
// shift is needed for it (Marlin's trick).
template <int S>
__device__ __forceinline__ void w4_pairs(const uint4& v, half2_t& a, half2_t& b) {
    const unsigned magic = 0x64006400u;
    const unsigned w = u4_get(v, S / 2) >> ((S & 1) ? 8 : 0);
    a = hsub2(and_or(w, 0x000F000Fu, magic), 0x64086408u);               // - (1024 + 8)
    b = hfma2(and_or(w, 0x00F000F0u, magic), 0x2C002C00u, 0xD480D480u);  // * 1/16 - 72
}

// Pair P of one W3 row in the tile layout (words w0, w1, w2; diagram in w3_tiles.py).
// Fields at bits 0 / 3 / 6 of a half-word: 1024 + u / 1024 + 8u / 1024 + 64u after one LOP3,
// then - 1028 / * 1/8 - 132 / * 1/64 - 20 gives u - 4. Bits 9 and 12 share one shift by 9.
// Pair 15's bits are the three sign bits: (w & 0x8000) | 0x6400 = 1024 (1 - 2 bit), and
// -1/2048, -1/1024, -1/512 times those three plus -1/2 add up to u - 4 (every step exact).
template <int P>
__device__ __forceinline__ half2_t w3_pair(unsigned w0, unsigned w1, unsigned w2) {
    const unsigned magic = 0x64006400u;
    if constexpr (P == 15) {
        half2_t v = hfma2(and_or(w0, 0x80008000u, magic), 0x90009000u, 0xB800B800u);  // * -1/2048 - 1/2
        v = hfma2(and_or(w1, 0x80008000u, magic), 0x94009400u, v);                      // * -1/1024
        return hfma2(and_or(w2, 0x80008000u, magic), 0x98009800u, v);                   // * -1/512
    } else {
        constexpr int F = P % 5;
        const unsigned w = P < 5 ? w0 : (P < 10 ? w1 : w2);
        const unsigned s = F >= 3 ? w >> 9 : w;
        if constexpr (F == 0 || F == 3) return hsub2(and_or(s, 0x00070007u, magic), 0x64046404u);
        if constexpr (F == 1 || F == 4) return hfma2(and_or(s, 0x00380038u, magic), 0x30003000u, 0xD820D820u);
        return hfma2(and_or(s, 0x01C001C0u, magic), 0x24002400u, 0xCD00CD00u);
    }
}

// The four A registers of mma step S: rows g, g + 8 x pairs 2S, 2S + 1 (mma_m16n8k16's a0..a3).
template <int S>
__device__ __forceinline__ void dequant_step(const Frag<4>& f, half2_t (&a)[4]) {
    w4_pairs<S>(f.r[0], a[0], a[2]);
    w4_pairs<S>(f.r[1], a[1], a[3]);
}

template <int S>
__device__ __forceinline__ void dequant_step(const Frag<3>& f, half2_t (&a)[4]) {
    a[0] = w3_pair<2 * S>(f.a.x, f.a.y, f.b.x);
    a[2] = w3_pair<2 * S + 1>(f.a.x, f.a.y, f.b.x);
    a[1] = w3_pair<2 * S>(f.a.z, f.a.w, f.b.y);
    a[3] = w3_pair<2 * S + 1>(f.a.z, f.a.w, f.b.y);
}

// One tile, one group: the 8 mma steps, each dequantizing just the pairs it consumes (few
// registers live) and using them for every block of 8 batch rows (COLS mma per step).
// Step S: lane t's k-slots (2t, 2t+1) hold its pair 2S, (2t+8, 2t+9) pair 2S+1.
template <int BITS, int COLS, int S = 0>
__device__ __forceinline__ void mma_steps(float (&c)[COLS][4], const Frag<BITS>& f, const uint4 (&xv)[COLS][4]) {
    half2_t a[4];
    dequant_step<S>(f, a);
#pragma unroll
    for (int cb = 0; cb < COLS; ++cb)
        mma_m16n8k16(c[cb], a[0], a[1], a[2], a[3], u4_get(xv[cb][S / 2], (2 * S) & 3),
                     u4_get(xv[cb][S / 2], (2 * S + 1) & 3));
    if constexpr (S < 7) mma_steps<BITS, COLS, S + 1>(c, f, xv);
}

// The raw fp16 bits: converted where the scale is used (compute_stage). Converting here put
// the cvt right behind the load, so every stage's issue waited a whole memory round trip for
// its scales and the two register stages did not overlap loads with math.
__device__ __forceinline__ half_t load_scale(const half_t* p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}

// One stage: the weights and scales of UNROLL groups for all tiles of the warp.
template <int BITS, int TILES, int UNROLL>
struct Stage {
    Frag<BITS> frag[UNROLL][TILES];
    half_t sc[UNROLL][TILES][2];  // fp16 bits (load_scale)
};

// No bounds checks: the caller issues a stage only when its first group exists, a later group
// past the end is replaced by the last one (loaded, never used: compute_stage stops first), and
// the rows and batch rows past the end were clamped to real ones (their results are discarded).
template <int BITS, int TILES, int UNROLL>
__device__ __forceinline__ void load_stage(Stage<BITS, TILES, UNROLL>& st, const TilePtr<BITS> (&ptr)[TILES],
                                           int g0, int nwarps, int groups) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int grp = u == 0 ? g0 : min(g0 + u * nwarps, groups - 1);
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
            load_frag(st.frag[u][j], ptr[j], grp);
            st.sc[u][j][0] = load_scale(ptr[j].s + grp);
            st.sc[u][j][1] = load_scale(ptr[j].s + ptr[j].ds + grp);
        }
    }
}

// xrow: this lane's 32 inputs of group 0 as 16-byte vectors (batch row g of x, from 32t on;
// column block cb reads xoff[cb] vectors later: row g + 8cb; rows past M are clamped to row
// M - 1, whose mma column is discarded); group grp starts GROUP / 8 vectors later (x is shared
// by every warp of the block: L1 hits after the first).
template <int BITS, int TILES, int UNROLL, int COLS>
__device__ __forceinline__ void compute_stage(const Stage<BITS, TILES, UNROLL>& st, float (&acc)[TILES][COLS][4],
                                              const uint4* xrow, const int (&xoff)[COLS], int g0, int nwarps,
                                              int groups) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int grp = g0 + u * nwarps;
        if (grp >= groups) break;  // warp-uniform
        uint4 xv[COLS][4];
#pragma unroll
        for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
            for (int v = 0; v < 4; ++v)
                xv[cb][v] = xrow[xoff[cb] + grp * (GROUP / 8) + v];
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
            float c[COLS][4] = {};
            mma_steps<BITS, COLS>(c, st.frag[u][j], xv);
            const float s0 = h2f(st.sc[u][j][0]), s1 = h2f(st.sc[u][j][1]);
#pragma unroll
            for (int cb = 0; cb < COLS; ++cb) {
                acc[j][cb][0] = fmaf(s0, c[cb][0], acc[j][cb][0]);
                acc[j][cb][1] = fmaf(s0, c[cb][1], acc[j][cb][1]);
                acc[j][cb][2] = fmaf(s1, c[cb][2], acc[j][cb][2]);
                acc[j][cb][3] = fmaf(s1, c[cb][3], acc[j][cb][3]);
            }
        }
    }
}

// Which output accumulator c (0..3, mma's c0..c3) of result tile j and column block cb holds:
// unit (output feature) and batch row.
__device__ __forceinline__ int out_unit(int unit0, int j, int g, int c) { return unit0 + 16 * j + g + ((c & 2) ? 8 : 0); }
__device__ __forceinline__ int out_row(int cb, int t, int c) { return 8 * cb + 2 * t + (c & 1); }

// f(j, cb, c, unit, m) for every output accumulator of this lane (result tiles j < OUT_TILES,
// column blocks cb, c0..c3), fully unrolled so the arrays it indexes stay in registers.
template <int OUT_TILES, int COLS, class F>
__device__ __forceinline__ void each_output(int unit0, int g, int t, F f) {
#pragma unroll
    for (int j = 0; j < OUT_TILES; ++j)
#pragma unroll
        for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
            for (int c = 0; c < 4; ++c) f(j, cb, c, out_unit(unit0, j, g, c), out_row(cb, t, c));
}

// The fused RMSNorm of a staged batch-1 x (the row h, K values): every warp computes 1/rms
// from the producer's chunk sums (no barrier), each thread stages its vectors normalized. w0:
// this thread's first weight vector, loaded before the wait (the weight is constant).
__device__ __forceinline__ void stage_normalized(const half_t* h, const half_t* w, uint4 w0, const float* sums,
                                                 int K, float eps, int lane) {
    const uint4* hv = reinterpret_cast<const uint4*>(h);
    const uint4* wv = reinterpret_cast<const uint4*>(w);
    const int nvec = K / 8, i0 = threadIdx.x;
    const uint4 h0 = i0 < nvec ? hv[i0] : make_uint4(0, 0, 0, 0);  // in flight during the tree
    const float inv = rms_inv(chunk_total(sums, K / NORM_CHUNK, lane), K, eps);
    if (i0 < nvec) x_stage[i0] = normalize8(h0, w0, inv);
    for (int i = i0 + blockDim.x; i < nvec; i += blockDim.x) x_stage[i] = normalize8(hv[i], wv[i], inv);
}

// COLS blocks of 8 batch rows (M <= 8 * COLS): each dequantized fragment feeds COLS mma, so
// column block 0 is computed exactly as with COLS = 1 (rows 0..7 stay bit-equal).
// THREADS: the launch bound, 512 or 1024 (64 registers: only the one-tile, one-column instances).
// ksplit: how many slices K is cut into (one per warp, or two per warp when a 32-slice split
// runs on 16 warps: the 16-row instances need more than 64 registers). The split decides the
// summation order, so a weight keeps one split for every batch size (batch invariance).
// PRELOAD (0: off): the most groups a warp walks, all copied into shared memory before the
// wait (one column block, one group per stage; gemv.py preload_plan decides and sizes it).
template <int BITS, int TILES, bool GATED, int UNROLL, int COLS, int THREADS, bool STAGE_X, int PRELOAD = 0>
__global__ void __launch_bounds__(THREADS)
gemv_kernel(const unsigned* __restrict__ qa,      // W4 tiles [R, K/8] | W3 tiles a [R, K/16]
            const unsigned* __restrict__ qb,      // W3 tiles b [R, K/32] | unused
            const half_t* __restrict__ scales,    // [R, K/128]
            const half_t* __restrict__ x,         // [M, K]
            const half_t* __restrict__ bias,      // [N] or null
            const half_t* residual,               // [M, N] or null (may alias y)
            half_t* y,                            // [M, N]
            int M, int N, int K,                  // R = N rows, or 2N when GATED (gate; up)
            int ksplit,                           // a multiple of the block's warps, <= KSLOTS
            const half_t* __restrict__ norm_w,    // [K] or null: x is h, normalized (STAGE_X, M = 1)
            const float* __restrict__ norm_sums,  // [K / 16]: h's chunk sums (with norm_w)
            float eps,
            float* __restrict__ sums_out) {       // [M, N / 16] or null: chunk sums of y (not GATED)
    constexpr bool SPLIT = GATED && TILES == 1;  // warps alternate gate / up (nwarps, ksplit even)
    constexpr int OUT_TILES = GATED ? (SPLIT ? 1 : TILES / 2) : TILES;
    constexpr int RES_TILES = SPLIT ? 2 : TILES;  // tiles of results after the block reduction
    // Partial sums in shared memory: 32 slices only where they can occur (more would cost L1).
    constexpr int KSLOTS = (THREADS > 512 || COLS > 1) && TILES == 1 ? MAX_KSPLIT : MAX_KSPLIT / 2;
    static_assert(PRELOAD == 0 || (COLS == 1 && UNROLL == 1), "preloaded weights: one column block, unroll 1");
    pdl_launch_dependents();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int groups = K / GROUP;
    const int unit0 = blockIdx.x * (16 * OUT_TILES);
    const int kwarps = SPLIT ? ksplit >> 1 : ksplit;  // slices of the groups (per half when SPLIT)

    // Rows past N (a padded tile, or a whole tile past the end when TILES > 1) read the last
    // real row's scales and tile: valid addresses, results never stored. Every mma row and
    // column is independent of the others, so clamping changes no stored output.
    TilePtr<BITS> ptr[TILES];
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
        const int first = unit0 + 16 * (j % OUT_TILES);  // the tile's first output
        const bool up = SPLIT ? (warp & 1) : (GATED && j >= OUT_TILES);
        const long half0 = up ? (long)N : 0;  // first weight row of its half (gate / up)
        const long base = half0 + min(first, ((N - 1) / 16) * 16);  // its first weight row
        ptr[j] = tile_ptr(TilePtr<BITS>{}, qa, qb, scales, half0 + min(first + g, N - 1),
                          half0 + min(first + g + 8, N - 1), base, K, lane);
    }
    int xoff[COLS];  // column block cb reads batch row g + 8cb (clamped to M - 1)
#pragma unroll
    for (int cb = 0; cb < COLS; ++cb) xoff[cb] = (min(g + 8 * cb, M - 1) - min(g, M - 1)) * (K / 8);
    const uint4* xrow = STAGE_X ? x_stage + min(g, M - 1) * (K / 8) + 4 * t
                                : reinterpret_cast<const uint4*>(x + (long)min(g, M - 1) * K) + 4 * t;

    // W4 on SM90: the residual is loaded right after the wait (it may be the previous kernel's
    // output), so warp 0's epilogue needs no further round trip. (W3, and W4 on SM86, would
    // spill the registers it holds through the main loop.)
    constexpr bool EARLY_RESIDUAL = !GATED && BITS == 4 && EARLY_RESIDUAL_ARCH;
    half_t res_in[OUT_TILES][COLS][4] = {};
    const bool epilogue_warp = EARLY_RESIDUAL && warp == 0;

    uint4 norm_w0 = make_uint4(0, 0, 0, 0);  // constant: loaded before the wait
    if (STAGE_X && norm_w != nullptr && threadIdx.x < K / 8) norm_w0 = reinterpret_cast<const uint4*>(norm_w)[threadIdx.x];

    float acc[TILES][COLS][4];
    __shared__ float partial[KSLOTS][TILES * COLS * 4][32];
    // PRELOAD: the weight slots after x in dynamic shared memory (every warp: nmax groups of
    // TILES tiles); after the main loop they hold the slices' partial sums instead of partial.
    uint4* region = x_stage + (STAGE_X ? M * (K / 8) : 0);
    const int nmax = (groups + kwarps - 1) / kwarps;
    const int nslots = nwarps * nmax * TILES;
    float* region_partial = reinterpret_cast<float*>(region);
    // Once per warp (ksplit == nwarps), except for the 16-row instances of a 32-slice split.
    const int slices_per_warp = COLS > 1 ? ksplit / nwarps : 1;  // (a constant 1 lets the loop vanish)
    for (int v = 0; v < slices_per_warp; ++v) {
        const int slice = warp + v * nwarps;
        const int kwarp = SPLIT ? slice >> 1 : slice;  // this slice's first group
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
            for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[j][cb][c] = 0.f;

        // Two stages in registers: the next stage's loads are issued before this stage's math.
        const int step = kwarps * UNROLL;
        // (Unrolled by two so the stages swap roles without register copies.)
        Stage<BITS, TILES, UNROLL> a, b;
        half_t pre_sc[PRELOAD > 0 ? PRELOAD : 1][TILES][2];  // PRELOAD: every group's scales (fp16 bits)
        if constexpr (PRELOAD > 0) {
#pragma unroll
            for (int i = 0; i < PRELOAD; ++i) {
                const int grp = kwarp + i * kwarps;
                if (grp < groups)
#pragma unroll
                    for (int j = 0; j < TILES; ++j) {
                        preload_frag(ptr[j], grp, region, (warp * nmax + i) * TILES + j, nslots, lane);
                        pre_sc[i][j][0] = load_scale(ptr[j].s + grp);
                        pre_sc[i][j][1] = load_scale(ptr[j].s + ptr[j].ds + grp);
                    }
            }
        } else {
            if (kwarp < groups) load_stage(a, ptr, kwarp, kwarps, groups);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#pragma unroll
            for (int j = 0; j < TILES; ++j) {
                prefetch_groups(ptr[j], lane, kwarp + step, kwarps, groups);
                if (t == 0) prefetch_l2(ptr[j].s + kwarp);  // the line of the rows' scales it needs first
                if (t == 0) prefetch_l2(ptr[j].s + ptr[j].ds + kwarp);
            }
#endif
        }
        pdl_wait();  // the first weights are in flight; x (and y) belong to the previous kernel
        if constexpr (STAGE_X)
            if (v == 0) {  // every warp (barrier)
                if (norm_w != nullptr) {
                    stage_normalized(x, norm_w, norm_w0, norm_sums, K, eps, lane);
                } else {
                    const uint4* xv = reinterpret_cast<const uint4*>(x);
                    for (int i = threadIdx.x; i < M * (K / 8); i += blockDim.x) x_stage[i] = xv[i];
                }
                __syncthreads();
            }
        if (epilogue_warp && residual != nullptr && v == 0)
            each_output<OUT_TILES, COLS>(unit0, g, t, [&](int j, int cb, int c, int unit, int m) {
                if (unit < N && m < M) res_in[j][cb][c] = residual[(long)m * N + unit];
            });
        if constexpr (PRELOAD > 0) {
            cp_async_wait_all();  // this lane's copies (x staging above overlapped them)
#pragma unroll
            for (int i = 0; i < PRELOAD; ++i) {
                const int grp = kwarp + i * kwarps;
                if (grp >= groups) break;  // warp-uniform
                Stage<BITS, TILES, 1> st;
#pragma unroll
                for (int j = 0; j < TILES; ++j) {
                    read_frag(st.frag[0][j], region, (warp * nmax + i) * TILES + j, nslots, lane);
                    st.sc[0][j][0] = pre_sc[i][j][0];
                    st.sc[0][j][1] = pre_sc[i][j][1];
                }
                compute_stage(st, acc, xrow, xoff, grp, kwarps, groups);
            }
            if (ksplit > 1) __syncthreads();  // every warp is done with the slots: they take the partial sums
        } else {
            for (int g0 = kwarp; g0 < groups; g0 += 2 * step) {
                if (g0 + step < groups) load_stage(b, ptr, g0 + step, kwarps, groups);
                compute_stage(a, acc, xrow, xoff, g0, kwarps, groups);
                if (g0 + step >= groups) break;
                if (g0 + 2 * step < groups) load_stage(a, ptr, g0 + 2 * step, kwarps, groups);
                compute_stage(b, acc, xrow, xoff, g0 + step, kwarps, groups);
            }
        }
        if (ksplit > 1)
#pragma unroll
            for (int j = 0; j < TILES; ++j)
#pragma unroll
                for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const int at = (j * COLS + cb) * 4 + c;
                        if constexpr (PRELOAD > 0) region_partial[(slice * (TILES * COLS * 4) + at) * 32 + lane] = acc[j][cb][c];
                        else partial[slice][at][lane] = acc[j][cb][c];
                    }
    }

    // Add the slices' partial sums in a fixed order (deterministic, batch-invariant). Split:
    // result tile 0 (gate) sums the even slices, tile 1 (up) the odd ones.
    float res[RES_TILES][COLS][4];
    if (ksplit > 1) {
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int j = 0; j < RES_TILES; ++j)
#pragma unroll
            for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int w0 = SPLIT ? j : 0, dw = SPLIT ? 2 : 1, jj = SPLIT ? 0 : j;
                    const int at = (jj * COLS + cb) * 4 + c;
                    auto slice_sum = [&](int s) {
                        if constexpr (PRELOAD > 0) return region_partial[(s * (TILES * COLS * 4) + at) * 32 + lane];
                        else return partial[s][at][lane];
                    };
                    float v = slice_sum(w0);
#pragma unroll
                    for (int i = 1; i < KSLOTS; ++i)  // unrolled: all loads issued at once
                        if (w0 + i * dw < ksplit) v += slice_sum(w0 + i * dw);
                    res[j][cb][c] = v;
                }
    } else {
#pragma unroll
        for (int j = 0; j < RES_TILES; ++j)
#pragma unroll
            for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
                for (int c = 0; c < 4; ++c) res[j][cb][c] = acc[j < TILES ? j : 0][cb][c];  // (SPLIT needs ksplit >= 2)
    }

    if constexpr (GATED) {
        each_output<OUT_TILES, COLS>(unit0, g, t, [&](int j, int cb, int c, int unit, int m) {
            if (unit >= N || m >= M) return;
            const float gate = h2f(f2h(res[j][cb][c]));
            const float up = h2f(f2h(res[j + OUT_TILES][cb][c]));
            const float act = h2f(f2h(gate / (1.f + expf(-gate))));
            y[(long)m * N + unit] = f2h(act * up);
        });
    } else {
        half_t out[OUT_TILES][COLS][4];
        each_output<OUT_TILES, COLS>(unit0, g, t, [&](int j, int cb, int c, int unit, int m) {
            out[j][cb][c] = 0;
            if (unit >= N || m >= M) return;
            const long at = (long)m * N + unit;
            float v = res[j][cb][c];
            if (bias != nullptr) v += h2f(bias[unit]);
            out[j][cb][c] = f2h(v);
            if (residual != nullptr)
                out[j][cb][c] = f2h(h2f(out[j][cb][c]) + h2f(EARLY_RESIDUAL ? res_in[j][cb][c] : residual[at]));
            y[at] = out[j][cb][c];
        });
        // Chunk sums for a fused norm in the next GEMV: lane (g, t) holds units g and g + 8 of
        // rows 2t and 2t + 1 (per column block); the tree over g adds the pairs in common.cu's
        // order. N is a multiple of 16 (the launcher checks), so every chunk is whole.
        if (sums_out != nullptr)
#pragma unroll
            for (int j = 0; j < OUT_TILES; ++j)
#pragma unroll
                for (int cb = 0; cb < COLS; ++cb)
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        float p = sq_pair(h2f(out[j][cb][r]), h2f(out[j][cb][2 + r]));
#pragma unroll
                        for (int off = 4; off < 32; off <<= 1) p = __fadd_rn(p, __shfl_xor_sync(FULL_MASK, p, off));
                        const int chunk = unit0 / 16 + j, m = 8 * cb + 2 * t + r;
                        if (g == 0 && m < M && chunk * 16 < N) sums_out[(long)m * (N / 16) + chunk] = p;
                    }
    }
}
