// Helpers shared by every kernel file. The loader prepends this text to each .cu file
// before compiling (it is not compiled on its own), so the CuPy cache key covers it too.
//
// No CUDA headers are included on purpose: NVRTC from pip (cupy-cuda12x / cupy-cuda13x)
// does not always find cuda_fp16.h, so fp16 values travel as raw 16-bit patterns
// (`half_t`) or pairs of them in one 32-bit word (`half2_t`) and every fp16 operation
// is one line of PTX below. fp16 is only the storage type; math is fp32 unless noted.

typedef unsigned short half_t;   // one IEEE fp16 value (bit pattern)
typedef unsigned int half2_t;    // two fp16 values: low 16 bits = element 0

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float2 half2_to_float2(half2_t v) {
    return make_float2(h2f((half_t)(v & 0xffffu)), h2f((half_t)(v >> 16)));
}

__device__ __forceinline__ half2_t float2_to_half2(float lo, float hi) {
    return (half2_t)f2h(lo) | ((half2_t)f2h(hi) << 16);
}

// Rotate-half RoPE of one element pair (x1 = x[i], x2 = x[i + D/2], angle i): the first and
// the second half's value. Explicit _rn operations: nothing contracts into an FMA, so rope.cu
// and the fused attention (attention.cu) give the same bits, and both match the fp32 reference.
__device__ __forceinline__ float rope_first(float x1, float x2, float c, float s) {
    return __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
}

__device__ __forceinline__ float rope_second(float x1, float x2, float c, float s) {
    return __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// a - b on both halves, exact for the small integers the dequantizers produce.
__device__ __forceinline__ half2_t hsub2(half2_t a, half2_t b) {
    half2_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// c += A(16x16, row-major fp16) * B(16x8, col-major fp16), fp32 accumulate (sm_80+).
// Fragment layout (PTX ISA, mma.m16n8k16): lane = 4*g + t;
//   a0: A[g][2t..2t+1]    a1: A[g+8][2t..2t+1]   a2: A[g][2t+8..2t+9]   a3: A[g+8][2t+8..2t+9]
//   b0: B[2t..2t+1][g]    b1: B[2t+8..2t+9][g]
//   c0,c1: C[g][2t..2t+1] c2,c3: C[g+8][2t..2t+1]
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], half2_t a0, half2_t a1, half2_t a2,
                                             half2_t a3, half2_t b0, half2_t b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16-byte load that does not keep the line in L1: weights are read exactly once. Volatile:
// issued where written, so a kernel can put a whole stage of loads in flight before its math.
__device__ __forceinline__ uint4 load_streaming_16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ uint2 load_streaming_8(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];"
                 : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned load_streaming_4(const void* p) {
    unsigned v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// Asynchronous copies global -> shared (sm_80+): no register holds the data in flight, and a
// thread's own copies are visible to it after cp_async_wait_all() (no barrier needed when
// each lane reads back only what it copied). 16 bytes bypass L1 (.cg); 8 bytes must use .ca.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

// Programmatic dependent launch (app/kernels/programmatic.py). Every kernel calls
// pdl_launch_dependents() first, so the next kernel in the stream may be scheduled while this
// one runs, and pdl_wait() before it reads an activation or writes anything: that waits until
// the previous kernel has finished and its writes are visible. Only constant data (weights)
// may be read before pdl_wait(), and values used only as L2 prefetch hints (attention's slot
// and length). Without a programmatic launch both are no-ops; below SM90 they compile to
// nothing (the SM80/SM86 code is unchanged).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Ask L2 for the 128-byte line holding p (no register result, never faults on the
// in-bounds addresses the kernels give it). Used in the window a programmatic launch opens:
// a kernel's blocks are resident while the previous kernel still runs.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A row's sum of squares in one fixed order, shared by the RMSNorm kernel and the GEMVs that
// produce (residual epilogue) and consume (staged x) it, so a norm fused into a GEMV is
// bit-equal to the norm kernel (docs/KERNELS.md § Fused norms). Chunk c is elements 16c..16c+15:
// p_e = x[16c+e]^2 + x[16c+e+8]^2 (e = 0..7), chunk = ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)).
// The row total over the chunks: lane l of one warp adds chunks l, l+32, ... in that order,
// then an xor tree over the lanes (16, 8, 4, 2, 1). Explicit _rn operations: no FMA contraction.
constexpr int NORM_CHUNK = 16;

__device__ __forceinline__ float sq_pair(float a, float b) { return __fadd_rn(__fmul_rn(a, a), __fmul_rn(b, b)); }

// Every lane of the warp gets the total of chunks P[0..nc) (P in global or shared memory).
__device__ __forceinline__ float chunk_total(const float* P, int nc, int lane) {
    float s = 0.f;
#pragma unroll 4
    for (int c = lane; c < nc; c += 32) s = __fadd_rn(s, P[c]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, off));
    return s;
}

__device__ __forceinline__ float rms_inv(float total, int H, float eps) {
    return 1.f / sqrtf(total / (float)H + eps);
}

// y = fp16(w * fp16(h * inv)) for 8 values (HF's Qwen2RMSNorm rounding).
__device__ __forceinline__ uint4 normalize8(uint4 h, uint4 w, float inv) {
    unsigned* ph = reinterpret_cast<unsigned*>(&h);
    const unsigned* pw = reinterpret_cast<const unsigned*>(&w);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 fh = half2_to_float2(ph[k]), fw = half2_to_float2(pw[k]);
        const float2 n = half2_to_float2(float2_to_half2(fh.x * inv, fh.y * inv));
        ph[k] = float2_to_half2(n.x * fw.x, n.y * fw.y);
    }
    return h;
}
