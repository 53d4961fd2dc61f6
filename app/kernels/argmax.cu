// Row-wise argmax of fp16 logits [B, V] -> int64 tokens [B], as torch.argmax: the first index
// of the largest value, a NaN counting as larger than any number (the first NaN wins).
// Two programmatic launches instead of PyTorch's one reduction, which sat exposed in the decode
// step's chain (docs/KERNELS.md § Norm, embedding lookup, argmax): argmax_part_kernel, grid
// (slices, B) with the slice count argmax.py's ARGMAX_BLOCKS (<= 32), reduces a slice of a row
// to (value, index); argmax_final_kernel, one warp per row, reduces the slices.

constexpr int ARGMAX_THREADS = 256;  // argmax.py ARGMAX_THREADS
constexpr int ARGMAX_UNROLL = 8;    // loads in flight per thread

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Whether (a, ia) comes before (b, ib) in torch.argmax's order.
__device__ __forceinline__ bool argmax_before(float a, int ia, float b, int ib) {
    const bool na = a != a, nb = b != b;
    if (na || nb) return na && (!nb || ia < ib);
    return a > b || (a == b && ia < ib);
}

__device__ __forceinline__ void argmax_warp(float& v, int& i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, v, off);
        const int oi = __shfl_xor_sync(FULL_MASK, i, off);
        if (argmax_before(ov, oi, v, i)) v = ov, i = oi;
    }
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_part_kernel(const half_t* __restrict__ logits, int vocab, float* __restrict__ part_v,
                   int* __restrict__ part_i) {
    pdl_launch_dependents();
    const int row = blockIdx.y, slice = (vocab + gridDim.x - 1) / gridDim.x;
    const int begin = blockIdx.x * slice, end = min(vocab, begin + slice);
    const half_t* x = logits + (long)row * vocab;
    float best = neg_inf();
    int at = vocab;  // past every index: loses to any real element
    pdl_wait();  // the logits are the previous kernel's output
    for (int base = begin + threadIdx.x; base < end; base += ARGMAX_THREADS * ARGMAX_UNROLL) {
        half_t v[ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {  // all loads first, then the compares
            const int k = base + u * ARGMAX_THREADS;
            v[u] = k < end ? x[k] : (half_t)0xFC00;  // -inf
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {
            const int k = base + u * ARGMAX_THREADS;
            if (k < end && argmax_before(h2f(v[u]), k, best, at)) best = h2f(v[u]), at = k;
        }
    }
    argmax_warp(best, at);
    __shared__ float wv[ARGMAX_THREADS / 32];
    __shared__ int wi[ARGMAX_THREADS / 32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) wv[warp] = best, wi[warp] = at;
    __syncthreads();
    if (warp != 0) return;
    best = lane < ARGMAX_THREADS / 32 ? wv[lane] : neg_inf();
    at = lane < ARGMAX_THREADS / 32 ? wi[lane] : vocab;
    argmax_warp(best, at);
    if (lane == 0) part_v[row * gridDim.x + blockIdx.x] = best, part_i[row * gridDim.x + blockIdx.x] = at;
}

extern "C" __global__ void __launch_bounds__(32)
argmax_final_kernel(const float* __restrict__ part_v, const int* __restrict__ part_i, int parts,
                    long long* __restrict__ tokens) {
    pdl_launch_dependents();
    const int row = blockIdx.x, lane = threadIdx.x;
    pdl_wait();
    float best = lane < parts ? part_v[row * parts + lane] : neg_inf();
    int at = lane < parts ? part_i[row * parts + lane] : 0x7FFFFFFF;
    argmax_warp(best, at);
    if (lane == 0) tokens[row] = at;
}
