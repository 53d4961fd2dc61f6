// Tokens drawn at a temperature from fp16 logits rows [B, ld], on the device and without a sort:
// the decode step's sampled rows that have no top-k / top-p (the tray's default, temperature
// 0.3). The distribution is softmax(l / T) over the first `vocab` logits of a row; the token
// is the first index whose cumulative weight exceeds u x total (app.engine.sampling.draw),
// u being the row's uniform number. Two programmatic launches, grid (DRAW_SLICES, B):
//
//   temperature_part_kernel  each slice of a row -> (m, z): its largest l / T and the sum of
//                            exp(l / T - m) over it, in one pass (online softmax).
//   temperature_pick_kernel  every block of a row combines the row's (m, z) in slice order, so
//                            all blocks agree on the total and on the slice that holds
//                            u x total; that block alone walks its slice in vocabulary order
//                            (contiguous chunks per thread, a block scan of their sums, then
//                            the crossing chunk element by element) and writes the token.
//
// Every sum runs in a fixed order: the same logits and u give the same token on every run.
// The cumulative sums round differently from PyTorch's (the reference), which moves a token
// boundary by ~1e-6 of the total, as the GPU's torch.cumsum already did (phase 15).
//
// Rows whose temperature is <= 0 keep the argmax already in `tokens`; rows with top-k or top-p
// (drawn after a sort by app.engine.cuda.draw) are left alone too. A NaN logit counts as -inf
// (never drawn); +inf is clamped to the largest float. A row with nothing drawable keeps its
// argmax.
//
// params: fp32 [4, params_stride]: temperature, top_p, top_k, u (app.engine.cuda.draw DRAW_INPUTS).

constexpr int DRAW_THREADS = 256;  // temperature_draw.py DRAW_THREADS
constexpr int DRAW_WARPS = DRAW_THREADS / 32;
constexpr int DRAW_UNROLL = 8;     // loads in flight per thread in the part kernel

__device__ __forceinline__ float draw_neg_inf() { return __int_as_float(0xff800000); }

// The row's temperature and uniform number, and whether this kernel draws the row.
__device__ __forceinline__ bool draws_row(const float* __restrict__ params, int stride, int row,
                                          float& temperature, float& u) {
    temperature = params[row];
    const float top_p = params[stride + row], top_k = params[2 * stride + row];
    u = params[3 * stride + row];
    return temperature > 0.f && top_p >= 1.f && top_k <= 0.f;
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

extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
temperature_part_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                        int params_stride, float* __restrict__ part_m, float* __restrict__ part_z) {
    pdl_launch_dependents();
    const int row = blockIdx.y, slices = gridDim.x;
    int begin, end;
    slice_bounds(vocab, slices, blockIdx.x, begin, end);
    pdl_wait();  // the logits and the parameters come from earlier work in the stream
    float temperature, u;
    if (!draws_row(params, params_stride, row, temperature, u)) return;
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
__device__ __forceinline__ float block_exclusive_scan(float value, float& total) {
    __shared__ float warp_sums[DRAW_WARPS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float inclusive = value;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const float o = __shfl_up_sync(FULL_MASK, inclusive, off);
        if (lane >= off) inclusive += o;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    float before = 0.f;
    total = 0.f;
    for (int w = 0; w < DRAW_WARPS; ++w) {
        if (w == warp) before = total;
        total += warp_sums[w];
    }
    return before + inclusive - value;
}

extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
temperature_pick_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                        int params_stride, const float* __restrict__ part_m, const float* __restrict__ part_z,
                        long long* __restrict__ tokens) {
    pdl_launch_dependents();
    const int row = blockIdx.y, slices = gridDim.x;
    pdl_wait();
    float temperature, u;
    if (!draws_row(params, params_stride, row, temperature, u)) return;
    // Every thread combines the row's slices the same way: the row's max, the total, and the
    // slice holding u x total (the last slice of positive weight at or before it, which also
    // catches a point rounded onto the total).
    const float* pm = part_m + row * slices;
    const float* pz = part_z + row * slices;
    float top = draw_neg_inf();
    for (int s = 0; s < slices; ++s) top = fmaxf(top, pm[s]);
    if (top == draw_neg_inf()) return;  // nothing drawable: the argmax stays
    float total = 0.f;
    for (int s = 0; s < slices; ++s) total += pm[s] == draw_neg_inf() ? 0.f : pz[s] * expf(pm[s] - top);
    const float point = u * total;
    float before = 0.f, owner_before = 0.f;
    int owner = -1;
    for (int s = 0; s < slices; ++s) {
        const float w = pm[s] == draw_neg_inf() ? 0.f : pz[s] * expf(pm[s] - top);
        if (w > 0.f && before <= point) owner = s, owner_before = before;
        before += w;
    }
    if (owner != blockIdx.x) return;
    const float target = point - owner_before;  // within this slice
    int begin, end;
    slice_bounds(vocab, slices, blockIdx.x, begin, end);
    const int chunk = (end - begin + DRAW_THREADS - 1) / DRAW_THREADS;
    const int first = min(end, begin + threadIdx.x * chunk), last = min(end, first + chunk);
    const half_t* x = logits + (long)row * ld;
    float mine = 0.f;
    int last_positive = -1;
    for (int i = first; i < last; ++i) {
        const float e = expf(scaled_logit(x[i], temperature) - top);
        mine += e;
        if (e > 0.f) last_positive = i;
    }
    float slice_total;
    const float mine_before = block_exclusive_scan(mine, slice_total);
    __shared__ int picked, fallback;
    if (threadIdx.x == 0) picked = 0x7FFFFFFF, fallback = -1;
    __syncthreads();
    if (mine > 0.f && mine_before <= target && target - mine_before < mine) {
        // The same additions as `mine`, so the walk crosses within this chunk. Two neighbours
        // may both claim the point where the scan rounds; the smaller index wins.
        const float want = target - mine_before;
        float acc = 0.f;
        for (int i = first; i < last; ++i) {
            acc += expf(scaled_logit(x[i], temperature) - top);
            if (acc > want) {
                atomicMin(&picked, i);
                break;
            }
        }
    }
    if (last_positive >= 0) atomicMax(&fallback, last_positive);  // the point rounded past the slice
    __syncthreads();
    if (threadIdx.x == 0) {
        const int token = picked != 0x7FFFFFFF ? picked : fallback;
        if (token >= 0) tokens[row] = token;
    }
}
