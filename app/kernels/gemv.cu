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

__device__ __forceinline__ void load_frag(RowFrag<4>& f, const unsigned* qa, const unsigned*,
                                          long row, int words_a, int, int group, int t) {
    f.w = load_streaming_16(qa + row * words_a + group * 16 + 4 * t);
}

__device__ __forceinline__ void load_frag(RowFrag<3>& f, const unsigned* qa, const unsigned* qb,
                                          long row, int words_a, int words_b, int group, int t) {
    f.lo = load_streaming_8(qa + row * words_a + group * 8 + 2 * t);
    f.hi = load_streaming_4(qb + row * words_b + group * 4 + t);
}

__device__ __forceinline__ void zero_frag(RowFrag<4>& f) { f.w = make_uint4(0, 0, 0, 0); }
__device__ __forceinline__ void zero_frag(RowFrag<3>& f) { f.lo = make_uint2(0, 0); f.hi = 0; }

// Pair p (0..15) of the lane's 32 inputs as half2 of the signed integers q (exact).
// Magic number: 0x6400 is fp16 1024, so OR-ing a small u into its mantissa gives 1024 + u.
__device__ __forceinline__ half2_t dequant_pair(const RowFrag<4>& f, int p) {
    const unsigned w = u4_get(f.w, p >> 2);
    const unsigned u = ((w >> (4 * (p & 3))) & 0x000F000Fu) | 0x64006400u;
    return hsub2(u, 0x64086408u);  // - (1024 + 8)
}

__device__ __forceinline__ half2_t dequant_pair(const RowFrag<3>& f, int p) {
    const unsigned lo = (p < 8) ? f.lo.x : f.lo.y;
    const unsigned u = ((lo >> (2 * (p & 7))) & 0x00030003u)
                     | (((f.hi >> p) & 0x00010001u) << 2) | 0x64006400u;
    return hsub2(u, 0x64046404u);  // - (1024 + 4)
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
    constexpr int OUT_TILES = GATED ? TILES / 2 : TILES;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int groups = K / GROUP;
    const int words_a = (BITS == 4) ? K / 8 : K / 16;
    const int words_b = K / 32;
    const int unit0 = blockIdx.x * (16 * OUT_TILES);

    long rows[TILES][2];
    bool row_ok[TILES][2];
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int unit = unit0 + 16 * (j % OUT_TILES) + g + 8 * h;
            row_ok[j][h] = unit < N;
            const long r = (GATED && j >= OUT_TILES) ? (long)N + unit : (long)unit;
            rows[j][h] = row_ok[j][h] ? r : 0;  // rows past N read row 0 with scale 0
        }
    }
    const bool has_x = g < M;
    const half_t* xrow = x + (long)g * K + 32 * t;

    float acc[TILES][4];
#pragma unroll
    for (int j = 0; j < TILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

    for (int g0 = warp; g0 < groups; g0 += nwarps * UNROLL) {
        RowFrag<BITS> frag[UNROLL][TILES][2];
        float sc[UNROLL][TILES][2];
        uint4 xv[UNROLL][4];
        // All loads of UNROLL groups first, so they are in flight together.
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int grp = g0 + u * nwarps;
            const bool ok = grp < groups;
#pragma unroll
            for (int j = 0; j < TILES; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (ok) load_frag(frag[u][j][h], qa, qb, rows[j][h], words_a, words_b, grp, t);
                    else zero_frag(frag[u][j][h]);
                    sc[u][j][h] = (ok && row_ok[j][h]) ? h2f(scales[rows[j][h] * groups + grp]) : 0.f;
                }
#pragma unroll
            for (int v = 0; v < 4; ++v)
                xv[u][v] = (ok && has_x) ? *(const uint4*)(xrow + (long)grp * GROUP + 8 * v)
                                         : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (g0 + u * nwarps >= groups) break;  // warp-uniform
#pragma unroll
            for (int j = 0; j < TILES; ++j) {
                float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int s = 0; s < 8; ++s) {
                    const int p0 = 2 * s, p1 = 2 * s + 1;
                    mma_m16n8k16(c, dequant_pair(frag[u][j][0], p0), dequant_pair(frag[u][j][1], p0),
                                 dequant_pair(frag[u][j][0], p1), dequant_pair(frag[u][j][1], p1),
                                 u4_get(xv[u][p0 >> 2], p0 & 3), u4_get(xv[u][p1 >> 2], p1 & 3));
                }
                acc[j][0] = fmaf(sc[u][j][0], c[0], acc[j][0]);
                acc[j][1] = fmaf(sc[u][j][0], c[1], acc[j][1]);
                acc[j][2] = fmaf(sc[u][j][1], c[2], acc[j][2]);
                acc[j][3] = fmaf(sc[u][j][1], c[3], acc[j][3]);
            }
        }
    }

    // Add the warps' partial sums in a fixed order (deterministic, batch-invariant).
    __shared__ float partial[MAX_WARPS][TILES * 4][32];
    if (nwarps > 1) {
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) partial[warp][j * 4 + c][lane] = acc[j][c];
        __syncthreads();
        if (warp != 0) return;
#pragma unroll
        for (int j = 0; j < TILES; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                float v = partial[0][j * 4 + c][lane];
                for (int w = 1; w < nwarps; ++w) v += partial[w][j * 4 + c][lane];
                acc[j][c] = v;
            }
    }

#pragma unroll
    for (int j = 0; j < OUT_TILES; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int unit = unit0 + 16 * j + g + ((c & 2) ? 8 : 0);
            const int m = 2 * t + (c & 1);
            if (unit >= N || m >= M) continue;
            const long at = (long)m * N + unit;
            half_t out;
            if (GATED) {
                const float gate = h2f(f2h(acc[j][c]));
                const float up = h2f(f2h(acc[j + OUT_TILES][c]));
                const float act = h2f(f2h(gate / (1.f + expf(-gate))));
                out = f2h(act * up);
            } else {
                float v = acc[j][c];
                if (bias != nullptr) v += h2f(bias[unit]);
                out = f2h(v);
                if (residual != nullptr) out = f2h(h2f(out) + h2f(residual[at]));
            }
            y[at] = out;
        }
}
