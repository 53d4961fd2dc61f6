// RMSNorm over the last dimension, one block per row, fp16 in/out, fp32 sum of squares.
// Rounding matches HF's Qwen2RMSNorm exactly: y = fp16(w * fp16(h * rsqrt(mean(h^2) + eps))).
// Optionally fused with the residual add before it: h = fp16(x + residual) is written to
// residual_out (which may alias residual) and normalised. H must be a multiple of 8 (16-byte
// vectors), at most 16,384. The sum of squares is taken in common.cu's chunk order, the one
// the GEMVs use when they fuse this norm: it depends on H only and each row is independent of
// the others (batch-invariant), and fused and unfused results are bit-equal.

constexpr int NORM_MAX_THREADS = 1024;
constexpr int NORM_MAX_CHUNKS = 1024;  // H <= 16,384 (norm_rope.py MAX_NORM_HIDDEN)

__device__ __forceinline__ uint4 add_half8(uint4 a, uint4 b) {
    unsigned* pa = reinterpret_cast<unsigned*>(&a);
    const unsigned* pb = reinterpret_cast<const unsigned*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 fa = half2_to_float2(pa[i]), fb = half2_to_float2(pb[i]);
        pa[i] = float2_to_half2(fa.x + fb.x, fa.y + fb.y);
    }
    return a;
}

// The sum of squares of chunk c (common.cu's order), whose 16 values this lane and lane ^ 1
// hold as vectors 2c and 2c + 1; both lanes return it. A vector past the row is zeros (an odd
// number of vectors: the last chunk is its first 8 values).
__device__ __forceinline__ float chunk_sum_pair(uint4 v, int lane) {
    const unsigned* p = reinterpret_cast<const unsigned*>(&v);
    const bool first_half = (lane & 1) == 0;
    float pe[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 f = half2_to_float2(p[k]);
        const float o0 = __shfl_xor_sync(FULL_MASK, f.x, 1), o1 = __shfl_xor_sync(FULL_MASK, f.y, 1);
        pe[2 * k] = first_half ? sq_pair(f.x, o0) : sq_pair(o0, f.x);
        pe[2 * k + 1] = first_half ? sq_pair(f.y, o1) : sq_pair(o1, f.y);
    }
    return __fadd_rn(__fadd_rn(__fadd_rn(pe[0], pe[1]), __fadd_rn(pe[2], pe[3])),
                     __fadd_rn(__fadd_rn(pe[4], pe[5]), __fadd_rn(pe[6], pe[7])));
}

// A thread's first vector stays in registers between the two passes (with the launcher's
// block size that is every vector up to H = 8192), and its weight vector is loaded before
// pdl_wait() (constant): the second pass needs no memory round trip.
extern "C" __global__ void __launch_bounds__(NORM_MAX_THREADS)
rms_norm_kernel(const half_t* __restrict__ x,         // [rows, H]
                const half_t* residual,               // [rows, H] or null
                half_t* residual_out,                 // [rows, H] or null (may alias residual)
                const half_t* __restrict__ weight,    // [H]
                half_t* __restrict__ y,               // [rows, H]
                int H, float eps) {
    pdl_launch_dependents();
    const long base = (long)blockIdx.x * H;
    const int nvec = H / 8, i0 = threadIdx.x;
    const uint4* xv = reinterpret_cast<const uint4*>(x + base);
    const uint4* rv = reinterpret_cast<const uint4*>(residual + base);
    uint4* hv = reinterpret_cast<uint4*>(residual_out + base);
    const uint4* wv = reinterpret_cast<const uint4*>(weight);
    uint4* yv = reinterpret_cast<uint4*>(y + base);
    const bool fused = residual != nullptr;
    const uint4 w0 = i0 < nvec ? wv[i0] : make_uint4(0, 0, 0, 0);
    pdl_wait();

    __shared__ float chunks[NORM_MAX_CHUNKS];
    const int lane = threadIdx.x & 31;
    uint4 h0 = make_uint4(0, 0, 0, 0);
    for (int first = 0; first < nvec; first += blockDim.x) {  // every thread: the pairs shuffle
        const int i = first + i0;
        uint4 h = make_uint4(0, 0, 0, 0);
        if (i < nvec) {
            h = xv[i];
            if (fused) {
                h = add_half8(h, rv[i]);
                hv[i] = h;
            }
        }
        if (first == 0) h0 = h;
        const float sum = chunk_sum_pair(h, lane);
        if (i < nvec && (i & 1) == 0) chunks[i >> 1] = sum;
    }
    __syncthreads();
    const float inv = rms_inv(chunk_total(chunks, (nvec + 1) / 2, lane), H, eps);

    if (i0 < nvec) yv[i0] = normalize8(h0, w0, inv);
    for (int i = i0 + blockDim.x; i < nvec; i += blockDim.x)
        yv[i] = normalize8(fused ? hv[i] : xv[i], wv[i], inv);  // the same thread wrote hv[i] above
}
