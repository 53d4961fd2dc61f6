// Quantized GEMV for decode: y[M, N] = x[M, K] @ W[N, K]^T with W in the W4 or W3 layout
// (docs/FORMATS.md), fp16 activations, fp32 accumulation, M <= 8.
//
// Work split. A warp owns TILES tiles of 16 weight rows; inside a tile the 32 lanes form 8
// teams of 4 (lane = 4*g + t): team g loads rows g and g+8, lane t the 32 inputs
// 32t..32t+31 of every group of 128. That is exactly the A operand of the tensor-core
// instruction mma.m16n8k16 (row g / g+8, k-slot pairs 2t.. and 2t+8..) once we decide which
// real k each k-slot stands for: in mma step s (0..7) lane t's slots (2t, 2t+1) hold its
// input pair 2s and slots (2t+8, 2t+9) its pair 2s+1. The B operand (x) uses the same
// mapping, column n = batch row g. So one group of 128 inputs x 16 rows is 8 mma steps, the
// scale is applied per group in fp32, and a batch of up to 8 rows costs the same as one.
//
// Batch invariance: column m of an mma depends only on A and column m of B, every other
// loop is independent of M, so row m of a batched call is bit-equal to a batch-1 call.
//
// The warps of a block share the same rows and split the groups (warp w takes groups
// w, w + nwarps, ...), then add their partial sums through shared memory in a fixed order.
// Gated with TILES == 1 ("split" gate/up): even warps take the gate tile, odd warps the up
// tile of the same 16 outputs (groups split among the warps of one parity), so a warp holds
// one tile's registers and the block still owns both halves for the SiLU epilogue.
// Each warp keeps two stages of weights in registers: the loads of the next UNROLL groups
// are issued before the math of the current ones, so every warp has two sets of loads in
// flight (latency, not bandwidth, limits a GEMV on a big GPU). Dequantization costs about
// one instruction per weight (LOP3 with the magic number + one f16x2 sub or fma per pair).
//
// Epilogue rounding matches the unfused PyTorch path exactly: y = fp16(acc + bias), then
// fp16(y + residual); gated: fp16(silu(fp16(gate))) * fp16(up) rounded to fp16.

constexpr int GROUP = 128;
constexpr int MAX_WARPS = 16;

__device__ __forceinline__ unsigned u4_get(const uint4& v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// What lane t of a row team holds for one row and one group.
template <int BITS> struct RowFrag;
template <> struct RowFrag<4> { uint4 w; };                  // 4 words: k = 32t .. 32t+31
template <> struct RowFrag<3> { uint2 lo; unsigned hi; };    // qlow words 2t, 2t+1; qhigh word t

// One weight row of one lane, with its group offset added per load (32-bit).
template <int BITS> struct RowPtr;
template <> struct RowPtr<4> { const unsigned* a; const half_t* s; };
template <> struct RowPtr<3> { const unsigned* a; const unsigned* b; const half_t* s; };

__device__ __forceinline__ RowPtr<4> row_ptr(RowPtr<4>, const unsigned* qa, const unsigned*, const half_t* scales,
                                             long row, int K, int t) {
    return {qa + row * (K / 8) + 4 * t, scales + row * (K / GROUP)};
}

__device__ __forceinline__ RowPtr<3> row_ptr(RowPtr<3>, const unsigned* qa, const unsigned* qb, const half_t* scales,
                                             long row, int K, int t) {
    return {qa + row * (K / 16) + 2 * t, qb + row * (K / 32) + t, scales + row * (K / GROUP)};
}

// Loads are volatile asm so they stay at the top of the stage in source order: the whole
// stage's weights are in flight together, one stage ahead of the mma that consumes them.
__device__ __forceinline__ void load_frag(RowFrag<4>& f, const RowPtr<4>& p, int group) {
    f.w = load_streaming_16(p.a + group * 16);
}

__device__ __forceinline__ void load_frag(RowFrag<3>& f, const RowPtr<3>& p, int group) {
    f.lo = load_streaming_8(p.a + group * 8);
    f.hi = load_streaming_4(p.b + group * 4);
}

__device__ __forceinline__ void zero_frag(RowFrag<4>& f) { f.w = make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ void zero_frag(RowFrag<3>& f) { f.lo = make_uint2(0, 0); f.hi = 0; }

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

// The 4 pairs of one W4 word as half2 of the signed integers q (exact). Pair i holds the
// nibbles at bit 4i of each 16-bit half. Magic number: 0x6400 is fp16 1024, so OR-ing a
// nibble u into its mantissa gives 1024 + u (bits 0-3) or 1024 + 16u (bits 4-7); the second
// kind is scaled by 1/16 in the same fma that subtracts (64 + 8): one instruction fewer per
// pair than shifting every nibble down (Marlin's trick).
// The two pairs of mma step S (pairs 2S and 2S + 1 of the lane's 32 inputs, as half2 of the
// signed integers q, exact). W4: pair p holds the nibbles at bit 4(p & 3) of each 16-bit
// half of word p / 4. Magic number: 0x6400 is fp16 1024, so OR-ing a nibble u into its
// mantissa gives 1024 + u (bits 0-3) or 1024 + 16u (bits 4-7); the second kind is scaled by
// 1/16 in the same fma that subtracts 64 + 8, so no shift is needed for it (Marlin's trick).
template <int S>
__device__ __forceinline__ void dequant_step(const RowFrag<4>& f, half2_t& a, half2_t& b) {
    const unsigned magic = 0x64006400u;
    const unsigned w = u4_get(f.w, S / 2) >> ((S & 1) ? 8 : 0);
    a = hsub2(and_or(w, 0x000F000Fu, magic), 0x64086408u);               // - (1024 + 8)
    b = hfma2(and_or(w, 0x00F000F0u, magic), 0x2C002C00u, 0xD480D480u);  // * 1/16 - 72
}

// W3 pair p: 2 low bits at bit 2(p & 7) of qlow word p / 8, the high bit at bit p of qhigh,
// moved to bit 2 with one shift; two LOP3 assemble 1024 + u.
template <int P>
__device__ __forceinline__ half2_t dequant_pair3(const RowFrag<3>& f) {
    const unsigned lo = (P < 8 ? f.lo.x : f.lo.y) >> (2 * (P & 7));
    const unsigned hi = P >= 2 ? f.hi >> (P - 2) : f.hi << (2 - P);
    const unsigned u = and_or(hi, 0x00040004u, and_or(lo, 0x00030003u, 0x64006400u));
    return hsub2(u, 0x64046404u);  // - (1024 + 4)
}

template <int S>
__device__ __forceinline__ void dequant_step(const RowFrag<3>& f, half2_t& a, half2_t& b) {
    a = dequant_pair3<2 * S>(f);
    b = dequant_pair3<2 * S + 1>(f);
}

// One tile, one group: the 8 mma steps, each dequantizing just the pairs it consumes (few
// registers live). Step S: lane t's k-slots (2t, 2t+1) hold its pair 2S, (2t+8, 2t+9) pair 2S+1.
template <int BITS, int S = 0>
__device__ __forceinline__ void mma_steps(float (&c)[4], const RowFrag<BITS>& r0, const RowFrag<BITS>& r1,
                                          const uint4 (&xv)[4]) {
    half2_t a0, b0, a1, b1;
    dequant_step<S>(r0, a0, b0);
    dequant_step<S>(r1, a1, b1);
    mma_m16n8k16(c, a0, a1, b0, b1, u4_get(xv[S / 2], (2 * S) & 3), u4_get(xv[S / 2], (2 * S + 1) & 3));
    if constexpr (S < 7) mma_steps<BITS, S + 1>(c, r0, r1, xv);
}

__device__ __forceinline__ float load_scale(const half_t* p) {
    unsigned short v;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return h2f(v);
}

// One stage: the weights and scales of UNROLL groups for all tiles of the warp.
template <int BITS, int TILES, int UNROLL>
struct Stage {
    RowFrag<BITS> frag[UNROLL][TILES][2];
    float sc[UNROLL][TILES][2];
};

template <int BITS, int TILES, int UNROLL>
__device__ __forceinline__ void load_stage(Stage<BITS, TILES, UNROLL>& st, const RowPtr<BITS> (&ptr)[TILES][2],
                                           const bool (&row_ok)[TILES][2], int g0, int nwarps, int groups) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int grp = g0 + u * nwarps;
        const bool ok = grp < groups;
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if (ok) load_frag(st.frag[u][j][h], ptr[j][h], grp);
                else zero_frag(st.frag[u][j][h]);
                st.sc[u][j][h] = (ok && row_ok[j][h]) ? load_scale(ptr[j][h].s + grp) : 0.f;
            }
    }
}

// xrow: this lane's 32 inputs of group 0 as 16-byte vectors (row g of x, from 32t on); group
// grp starts GROUP / 8 vectors later (x is shared by every warp of the block: L1 hits after
// the first).
template <int BITS, int TILES, int UNROLL>
__device__ __forceinline__ void compute_stage(const Stage<BITS, TILES, UNROLL>& st, float (&acc)[TILES][4],
                                              const uint4* xrow, bool has_x, int g0, int nwarps, int groups) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int grp = g0 + u * nwarps;
        if (grp >= groups) break;  // warp-uniform
        uint4 xv[4];
#pragma unroll
        for (int v = 0; v < 4; ++v) xv[v] = has_x ? xrow[grp * (GROUP / 8) + v] : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
            float c[4] = {0.f, 0.f, 0.f, 0.f};
            mma_steps<BITS>(c, st.frag[u][j][0], st.frag[u][j][1], xv);
            acc[j][0] = fmaf(st.sc[u][j][0], c[0], acc[j][0]);
            acc[j][1] = fmaf(st.sc[u][j][0], c[1], acc[j][1]);
            acc[j][2] = fmaf(st.sc[u][j][1], c[2], acc[j][2]);
            acc[j][3] = fmaf(st.sc[u][j][1], c[3], acc[j][3]);
        }
    }
}

template <int BITS, int TILES, bool GATED, int UNROLL>
__global__ void __launch_bounds__(MAX_WARPS * 32)
gemv_kernel(const unsigned* __restrict__ qa,      // W4 qweight [R, K/8] | W3 qlow [R, K/16]
            const unsigned* __restrict__ qb,      // W3 qhigh [R, K/32] | unused
            const half_t* __restrict__ scales,    // [R, K/128]
            const half_t* __restrict__ x,         // [M, K]
            const half_t* __restrict__ bias,      // [N] or null
            const half_t* residual,               // [M, N] or null (may alias y)
            half_t* y,                            // [M, N]
            int M, int N, int K) {                // R = N rows, or 2N when GATED (gate; up)
    constexpr bool SPLIT = GATED && TILES == 1;  // warps alternate gate / up (nwarps even)
    constexpr int OUT_TILES = GATED ? (SPLIT ? 1 : TILES / 2) : TILES;
    constexpr int RES_TILES = SPLIT ? 2 : TILES;  // tiles of results after the block reduction
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int groups = K / GROUP;
    const int unit0 = blockIdx.x * (16 * OUT_TILES);
    const int kwarp = SPLIT ? warp >> 1 : warp, kwarps = SPLIT ? nwarps >> 1 : nwarps;  // split of the groups

    RowPtr<BITS> ptr[TILES][2];
    bool row_ok[TILES][2];
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int unit = unit0 + 16 * (j % OUT_TILES) + g + 8 * h;
            row_ok[j][h] = unit < N;
            const bool up = SPLIT ? (warp & 1) : (GATED && j >= OUT_TILES);
            const long r = up ? (long)N + unit : (long)unit;
            ptr[j][h] = row_ptr(RowPtr<BITS>{}, qa, qb, scales, row_ok[j][h] ? r : 0, K, t);  // rows past N: row 0, scale 0
        }
    }
    const bool has_x = g < M;
    const uint4* xrow = reinterpret_cast<const uint4*>(x + (long)g * K) + 4 * t;

    float acc[TILES][4];
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

    // Two stages in registers: the next stage's loads are issued before this stage's math.
    const int step = kwarps * UNROLL;
    // (Unrolled by two so the stages swap roles without register copies.)
    Stage<BITS, TILES, UNROLL> a, b;
    load_stage(a, ptr, row_ok, kwarp, kwarps, groups);
    for (int g0 = kwarp; g0 < groups; g0 += 2 * step) {
        if (g0 + step < groups) load_stage(b, ptr, row_ok, g0 + step, kwarps, groups);
        compute_stage(a, acc, xrow, has_x, g0, kwarps, groups);
        if (g0 + step >= groups) break;
        if (g0 + 2 * step < groups) load_stage(a, ptr, row_ok, g0 + 2 * step, kwarps, groups);
        compute_stage(b, acc, xrow, has_x, g0 + step, kwarps, groups);
    }

    // Add the warps' partial sums in a fixed order (deterministic, batch-invariant). Split:
    // result tile 0 (gate) sums the even warps, tile 1 (up) the odd ones.
    float res[RES_TILES][4];
    __shared__ float partial[MAX_WARPS][TILES * 4][32];
    if (nwarps > 1) {
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) partial[warp][j * 4 + c][lane] = acc[j][c];
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int j = 0; j < RES_TILES; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int w0 = SPLIT ? j : 0, dw = SPLIT ? 2 : 1, jj = SPLIT ? 0 : j;
                float v = partial[w0][jj * 4 + c][lane];
#pragma unroll
                for (int i = 1; i < MAX_WARPS; ++i)  // unrolled: all loads issued at once
                    if (w0 + i * dw < nwarps) v += partial[w0 + i * dw][jj * 4 + c][lane];
                res[j][c] = v;
            }
    } else {
#pragma unroll
        for (int j = 0; j < RES_TILES; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) res[j][c] = acc[j < TILES ? j : 0][c];  // (SPLIT needs nwarps >= 2)
    }

#pragma unroll
    for (int j = 0; j < OUT_TILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int unit = unit0 + 16 * j + g + ((c & 2) ? 8 : 0);
            const int m = 2 * t + (c & 1);
            if (unit >= N || m >= M) continue;
            const long at = (long)m * N + unit;
            if constexpr (GATED) {
                const float gate = h2f(f2h(res[j][c]));
                const float up = h2f(f2h(res[j + OUT_TILES][c]));
                const float act = h2f(f2h(gate / (1.f + expf(-gate))));
                y[at] = f2h(act * up);
            } else {
                float v = res[j][c];
                if (bias != nullptr) v += h2f(bias[unit]);
                half_t out = f2h(v);
                if (residual != nullptr) out = f2h(h2f(out) + h2f(residual[at]));
                y[at] = out;
            }
        }
}
