// RoPE (HF rotate-half convention) fused with the static KV-cache write, for decode and prefill.
// Input: the fused qkv projection [T, (Hq + 2*Hkv) * D] (q heads, then k heads, then v heads).
// One warp per (token, head):
//   q heads: rotated, written to q_out [T, Hq, D];
//   k heads: rotated, written to k_cache[slot, head, pos, :];
//   v heads: copied to v_cache[slot, head, pos, :].
// cos/sin tables are fp32 [P, row_stride] with cos(pos * inv_freq[i]) in column i < D/2
// (the engine's [P, D] tables, whose second half repeats the first, fit as they are).
// Math in fp32 (common.cu rope_first / rope_second), one rounding to fp16. A token whose
// position or slot is out of range writes nothing (memory safety; the engine checks ranges
// before it launches). The decode step fuses all of this into the attention (attention.cu).

extern "C" __global__ void
rope_kv_kernel(const half_t* __restrict__ qkv, half_t* __restrict__ q_out,
               half_t* __restrict__ k_cache, half_t* __restrict__ v_cache,   // [S, Hkv, L, D]
               const float* __restrict__ cos_t, const float* __restrict__ sin_t,
               const int* __restrict__ positions, const int* __restrict__ slots,  // [T]
               int T, int Hq, int Hkv, int D, int table_rows, int table_stride,
               int L, int num_slots) {
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const long wid = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int heads = Hq + 2 * Hkv;
    if (wid >= (long)T * heads) return;
    const int tok = (int)(wid / heads), head = (int)(wid % heads);
    const int pos = positions[tok], slot = slots[tok];
    const half_t* src = qkv + (long)tok * heads * D + (long)head * D;
    const bool cache_ok = pos >= 0 && pos < L && slot >= 0 && slot < num_slots;

    if (head >= Hq + Hkv) {  // v: plain copy
        if (!cache_ok) return;
        uint4* dst = reinterpret_cast<uint4*>(
            v_cache + (((long)slot * Hkv + (head - Hq - Hkv)) * L + pos) * D);
        for (int i = lane; i < D / 8; i += 32) dst[i] = reinterpret_cast<const uint4*>(src)[i];
        return;
    }
    if (pos < 0 || pos >= table_rows) return;
    half_t* dst;
    if (head < Hq) {
        dst = q_out + ((long)tok * Hq + head) * D;
    } else {
        if (!cache_ok) return;
        dst = k_cache + (((long)slot * Hkv + (head - Hq)) * L + pos) * D;
    }
    const int half = D / 2;
    const float* cs = cos_t + (long)pos * table_stride;
    const float* sn = sin_t + (long)pos * table_stride;
    for (int j = lane; j < half / 2; j += 32) {  // element pair (2j, 2j+1) of each half
        const float2 a = half2_to_float2(reinterpret_cast<const half2_t*>(src)[j]);
        const float2 b = half2_to_float2(reinterpret_cast<const half2_t*>(src + half)[j]);
        const float c0 = cs[2 * j], c1 = cs[2 * j + 1], s0 = sn[2 * j], s1 = sn[2 * j + 1];
        reinterpret_cast<half2_t*>(dst)[j] =
            float2_to_half2(rope_first(a.x, b.x, c0, s0), rope_first(a.y, b.y, c1, s1));
        reinterpret_cast<half2_t*>(dst + half)[j] =
            float2_to_half2(rope_second(a.x, b.x, c0, s0), rope_second(a.y, b.y, c1, s1));
    }
}
