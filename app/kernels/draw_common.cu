// Shared by the device draw's kernels (temperature_draw.cu, filtered_draw.cu): the loader puts
// this text after common.cu and before either file (loader.PRELUDES). Tokens are drawn from
// fp16 logits rows [B, ld] over their first `vocab` logits, for the decode step's sampled
// rows, without a sort; the references are app.kernels.reference.temperature_draw_ref and
// app.engine.sampling.sample_rows.
//
// A row's distribution is softmax(l / T); the token is the first index whose cumulative weight
// exceeds u x total (app.engine.sampling.draw), u being the row's uniform number. A row is cut
// into DRAW_SLICES slices, one block each (grid (DRAW_SLICES, B)), and every draw starts with
// temperature_part_kernel: each slice's largest l / T and the sum of exp(l / T - max) over it,
// in one pass (online softmax). Every sum runs in a fixed order, so the same logits and u give
// the same token on every run; the cumulative sums round differently from PyTorch's, which
// moves a token boundary by ~1e-6 of the total, as the GPU's torch.cumsum already did.
//
// A NaN logit counts as -inf (never drawn); +inf is clamped to the largest float; a row with
// nothing drawable keeps its argmax. Rows at temperature <= 0 keep the argmax in `tokens`.
//
// params: fp32 [4, params_stride]: temperature, top_p, top_k, u (app.engine.cuda.draw DRAW_INPUTS).

constexpr int DRAW_SLICES = 32;    // token_draw.py DRAW_SLICES (grid.x)
constexpr int DRAW_THREADS = 256;  // token_draw.py DRAW_THREADS
constexpr int DRAW_WARPS = DRAW_THREADS / 32;
constexpr int DRAW_UNROLL = 8;     // loads in flight per thread in the part kernel

__device__ __forceinline__ float draw_neg_inf() { return __int_as_float(0xff800000); }

// The row's temperature and uniform number, and whether this kernel draws the row: at a
// temperature alone (FILTERED false) or with top-k / top-p (FILTERED true).
template <bool FILTERED>
__device__ __forceinline__ bool draws_row(const float* __restrict__ params, int stride, int row,
                                          float& temperature, float& u) {
    temperature = params[row];
    const float top_p = params[stride + row], top_k = params[2 * stride + row];
    u = params[3 * stride + row];
    return temperature > 0.f && (top_p < 1.f || top_k > 0.f) == FILTERED;
}

// l / T in fp32 (the reference divides too); NaN -> -inf, +inf -> the largest float.
__device__ __forceinline__ float scaled_logit(half_t h, float temperature) {
    const float v = h2f(h);
    if (v != v) return draw_neg_inf();
    return fminf(__fdiv_rn(v, temperature), 3.0e38f);
}

// (m, z) += (om, oz), z being a sum of exp(x - m).
__device__ __forceinline__ void softmax_merge(float& m, float& z, float om, float oz) {
    if (om == draw_neg_inf()) return;
    if (m == draw_neg_inf()) {
        m = om, z = oz;
    } else if (om > m) {
        z = z * expf(m - om) + oz, m = om;
    } else {
        z += oz * expf(om - m);
    }
}

__device__ __forceinline__ void slice_bounds(int vocab, int slices, int slice, int& begin, int& end) {
    const int len = (vocab + slices - 1) / slices;
    begin = min(vocab, slice * len), end = min(vocab, begin + len);
}

template <bool FILTERED>
__global__ void __launch_bounds__(DRAW_THREADS)
temperature_part_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                        int params_stride, float* __restrict__ part_m, float* __restrict__ part_z) {
    pdl_launch_dependents();
    const int row = blockIdx.y, slices = gridDim.x;
    int begin, end;
    slice_bounds(vocab, slices, blockIdx.x, begin, end);
    pdl_wait();  // the logits and the parameters come from earlier work in the stream
    float temperature, u;
    if (!draws_row<FILTERED>(params, params_stride, row, temperature, u)) return;
    const half_t* x = logits + (long)row * ld;
    float m = draw_neg_inf(), z = 0.f;
    for (int base = begin + threadIdx.x; base < end; base += DRAW_THREADS * DRAW_UNROLL) {
        half_t v[DRAW_UNROLL];
#pragma unroll
        for (int k = 0; k < DRAW_UNROLL; ++k) {  // all loads first, then the math
            const int i = base + k * DRAW_THREADS;
            v[k] = i < end ? x[i] : (half_t)0xFC00;  // -inf
        }
#pragma unroll
        for (int k = 0; k < DRAW_UNROLL; ++k) {
            const float s = scaled_logit(v[k], temperature);
            if (s == draw_neg_inf()) continue;
            if (s > m) {
                z = z * expf(m - s) + 1.f, m = s;  // m = -inf at first: z stays 0, then 1
            } else {
                z += expf(s - m);
            }
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float om = __shfl_xor_sync(FULL_MASK, m, off), oz = __shfl_xor_sync(FULL_MASK, z, off);
        softmax_merge(m, z, om, oz);
    }
    __shared__ float wm[DRAW_WARPS], wz[DRAW_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) wm[warp] = m, wz[warp] = z;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < DRAW_WARPS; ++w) softmax_merge(m, z, wm[w], wz[w]);
    part_m[row * slices + blockIdx.x] = m;
    part_z[row * slices + blockIdx.x] = z;
}

// Exclusive prefix of `value` over the block's threads (fixed order); `total` gets the sum.
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T value, T& total) {
    __shared__ T warp_sums[DRAW_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    T inclusive = value;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const T o = __shfl_up_sync(FULL_MASK, inclusive, off);
        if (lane >= off) inclusive += o;
    }
    __syncthreads();  // an earlier call's readers are done with warp_sums
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    T before = 0;
    total = 0;
    for (int w = 0; w < DRAW_WARPS; ++w) {
        if (w == warp) before = total;
        total += warp_sums[w];
    }
    return before + inclusive - value;
}

// ---- The row's slices combined by warp 0, lane s = slice s (DRAW_SLICES == 32). Fixed-order
// shuffles: every block of a row computes the same values.

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {  // the same in every lane (addition commutes)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_exclusive_scan(T v) {
    T inclusive = v;
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const T o = __shfl_up_sync(FULL_MASK, inclusive, off);
        if (lane >= off) inclusive += o;
    }
    const T before = __shfl_up_sync(FULL_MASK, inclusive, 1);
    return lane == 0 ? T(0) : before;
}

// This lane's slice weight: its softmax sum relative to the row's max `top`.
__device__ __forceinline__ float slice_softmax_weight(float m, float z, float top) {
    return m == draw_neg_inf() ? 0.f : z * expf(m - top);
}

struct DrawOwner { int slice; float before, point; };

// The slice holding u x total of the lanes' weights: the last slice of positive weight whose
// prefix is at or before the point (which also catches a point rounded onto the total).
__device__ __forceinline__ DrawOwner owning_slice(float w, float u) {
    const float before = warp_exclusive_scan<float>(w);
    const float point = u * warp_sum<float>(w);
    const unsigned fits = __ballot_sync(FULL_MASK, w > 0.f && before <= point);
    const int slice = fits ? 31 - __clz(fits) : -1;
    return {slice, __shfl_sync(FULL_MASK, before, slice < 0 ? 0 : slice), point};
}
