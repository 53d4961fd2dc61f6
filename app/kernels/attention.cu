// GQA decode attention over the static KV cache, flash-decoding style.
//
// q [B, Hq, D] (one new token per sequence, already rotated), caches [S, Hkv, L, D],
// seq_lens[b] = number of cached positions to attend to (the new token included),
// slots[b] = the cache slot of sequence b. Hq = Hkv * G. A sequence with length 0 or a slot
// out of range gets zeros (memory safety; the engine checks ranges).
//
// Pass 1 (attn_split_kernel), grid (nsplit, Hkv, B): block (split, kv head, b) covers
// positions [split * chunk, (split + 1) * chunk) with chunk = max(min_chunk,
// ceil(len / nsplit)), for all G query heads of the kv head at once, so each K/V row is
// read once per group. Inside a block, D/8 lanes share one key (16 bytes each) and a warp
// handles 32/(D/8) keys per step with an online softmax in fp32 (base-2 exponent, the
// scale * log2(e) folded into q). The block writes an unnormalised partial (o, m, l).
// Pass 2 (attn_combine_kernel) merges the partials of the splits that had work, four
// threads per output element.
//
// nsplit is a launch constant chosen by the host from the model and the device, never from
// the batch, and every merge runs in a fixed order: a sequence's result does not depend on
// what else is in the batch, and the grid does not depend on the lengths (graph-safe).

constexpr int ATTN_WARPS = 4;
constexpr int MAX_SPLITS = 256;  // keep in sync with attention.py
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ int split_chunk(int len, int nsplit, int min_chunk) {
    const int c = (len + nsplit - 1) / nsplit;
    return c < min_chunk ? min_chunk : c;
}

__device__ __forceinline__ void unpack_half8(uint4 v, float (&f)[8]) {
    const unsigned* p = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 t = half2_to_float2(p[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// exp2(a - b) that is 0 (not NaN) for a = -inf.
__device__ __forceinline__ float rescale(float a, float b) {
    return a == NEG_INF ? 0.f : exp2f(a - b);
}

// SM90 (programmatic launches): while the previous kernel (RoPE + KV write) finishes, ask L2
// for the K and V rows this block will read. Runs before pdl_wait(), so slots / seq_lens may
// in principle still be changing (they are the step's inputs, set before the graph runs): a
// stale value only misdirects a prefetch, and the addresses are clamped into the cache. The
// rows themselves are loaded after the wait, when the new token's K/V are in place.
template <int D>
__device__ __forceinline__ void prefetch_chunk(const half_t* k_cache, const half_t* v_cache, const int* seq_lens,
                                               const int* slots, int b, int hkv, int split, int Hkv, int L,
                                               int num_slots, int nsplit, int min_chunk) {
    const int slot = min(max(slots[b], 0), num_slots - 1);
    const int len = min(max(seq_lens[b], 0), L);
    const int chunk = split_chunk(len, nsplit, min_chunk);
    const int p0 = split * chunk, p1 = min(len, p0 + chunk);
    if (p0 >= p1) return;
    const long first = (((long)slot * Hkv + hkv) * L + p0) * D;  // rows p0 .. p1 - 1 are contiguous
    const int lines = ((p1 - p0) * D * 2 + 127) / 128;
    for (int i = threadIdx.x; i < 2 * lines; i += blockDim.x) {
        const half_t* base = i < lines ? k_cache : v_cache;
        prefetch_l2(reinterpret_cast<const char*>(base + first) + (long)(i < lines ? i : i - lines) * 128);
    }
}

template <int D, int G>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_split_kernel(const half_t* __restrict__ q, const half_t* __restrict__ k_cache,
                  const half_t* __restrict__ v_cache, const int* __restrict__ seq_lens,
                  const int* __restrict__ slots,
                  float* __restrict__ part_o,    // [B, Hq, nsplit, D]
                  float* __restrict__ part_ml,   // [B, Hq, nsplit, 2]
                  int Hkv, int L, int num_slots, int nsplit, int min_chunk, float scale_log2) {
    constexpr int KL = D / 8;     // lanes per key
    constexpr int KPW = 32 / KL;  // keys per warp step
    pdl_launch_dependents();
    const int split = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    prefetch_chunk<D>(k_cache, v_cache, seq_lens, slots, b, hkv, split, Hkv, L, num_slots, nsplit, min_chunk);
#endif
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / KL, kl = lane % KL;
    const int slot = slots[b];
    const int len = (slot >= 0 && slot < num_slots) ? min(seq_lens[b], L) : 0;
    const int chunk = split_chunk(len, nsplit, min_chunk);
    const int s0 = split * chunk;
    if (s0 >= len) return;
    const int s1 = min(len, s0 + chunk);
    const int Hq = Hkv * G;

    float qf[G][8], o[G][8], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        unpack_half8(*reinterpret_cast<const uint4*>(q + ((long)b * Hq + hkv * G + h) * D + kl * 8), qf[h]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            qf[h][e] *= scale_log2;
            o[h][e] = 0.f;
        }
        m[h] = NEG_INF;
        l[h] = 0.f;
    }

    const long row0 = ((long)slot * Hkv + hkv) * L;
    const int step = ATTN_WARPS * KPW;
    // Rows past s1 read row s0 (valid memory) and are masked out below.
    auto row_at = [&](int b0) { const int p = b0 + sub; return (row0 + (p < s1 ? p : s0)) * D + kl * 8; };
    int base = s0 + warp * KPW;
    uint4 k_next = make_uint4(0, 0, 0, 0), v_next = k_next;
    if (base < s1) {
        k_next = *reinterpret_cast<const uint4*>(k_cache + row_at(base));
        v_next = *reinterpret_cast<const uint4*>(v_cache + row_at(base));
    }
    for (; base < s1; base += step) {
        const bool valid = base + sub < s1;
        float kf[8], vf[8];
        unpack_half8(k_next, kf);
        unpack_half8(v_next, vf);
        if (base + step < s1) {  // prefetch the next keys while this step computes
            k_next = *reinterpret_cast<const uint4*>(k_cache + row_at(base + step));
            v_next = *reinterpret_cast<const uint4*>(v_cache + row_at(base + step));
        }
        // Scores of the G heads, then the lane reduction one level at a time for all of them
        // (G independent shuffles in flight instead of one head's chain after another).
        float sc[G];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            sc[h] = 0.f;
#pragma unroll
            for (int e = 0; e < 8; ++e) sc[h] = fmaf(qf[h][e], kf[e], sc[h]);
        }
#pragma unroll
        for (int off = KL / 2; off > 0; off >>= 1)
#pragma unroll
            for (int h = 0; h < G; ++h) sc[h] += __shfl_xor_sync(FULL_MASK, sc[h], off);
        // Branch-free: a masked key scores -inf (corr = 1, p = 0: nothing changes).
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float s = valid ? sc[h] : NEG_INF;
            const float mn = fmaxf(m[h], s);
            const float corr = rescale(m[h], mn), p = rescale(s, mn);
            l[h] = l[h] * corr + p;
#pragma unroll
            for (int e = 0; e < 8; ++e) o[h][e] = fmaf(o[h][e], corr, p * vf[e]);
            m[h] = mn;
        }
    }

    // Merge the key groups of the warp (lanes with the same kl), then the warps.
#pragma unroll
    for (int off = KL; off < 32; off <<= 1) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float m2 = __shfl_xor_sync(FULL_MASK, m[h], off);
            const float l2 = __shfl_xor_sync(FULL_MASK, l[h], off);
            const float mn = fmaxf(m[h], m2);
            const float a = rescale(m[h], mn), c = rescale(m2, mn);
            l[h] = l[h] * a + l2 * c;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const float o2 = __shfl_xor_sync(FULL_MASK, o[h][e], off);
                o[h][e] = o[h][e] * a + o2 * c;
            }
            m[h] = mn;
        }
    }
    __shared__ float sm_o[ATTN_WARPS][G][D];
    __shared__ float sm_m[ATTN_WARPS][G], sm_l[ATTN_WARPS][G];
    if (sub == 0) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
#pragma unroll
            for (int e = 0; e < 8; ++e) sm_o[warp][h][kl * 8 + e] = o[h][e];
            if (kl == 0) {
                sm_m[warp][h] = m[h];
                sm_l[warp][h] = l[h];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        float mx = NEG_INF;
        for (int w = 0; w < ATTN_WARPS; ++w) mx = fmaxf(mx, sm_m[w][h]);
        float lsum = 0.f, osum = 0.f;
        for (int w = 0; w < ATTN_WARPS; ++w) {
            const float f = rescale(sm_m[w][h], mx);
            lsum += sm_l[w][h] * f;
            osum += sm_o[w][h][d] * f;
        }
        const long head = (long)b * Hq + hkv * G + h;
        part_o[(head * nsplit + split) * D + d] = osum;
        if (d == 0) {
            part_ml[(head * nsplit + split) * 2] = mx;
            part_ml[(head * nsplit + split) * 2 + 1] = lsum;
        }
    }
}

// Pass 2: grid (Hq, B), COMBINE_PARTS * D threads. Thread (part, d) sums the splits
// part, part + COMBINE_PARTS, ... of element d (a quarter of the dependent global loads of
// one thread per element); the parts are then added in a fixed order (deterministic). The
// max over the splits' m is a warp reduction in every warp (no barrier, no serial walk),
// the sum of the weighted l a fixed-order reduction in the last warp while the others load.
constexpr int COMBINE_PARTS = 4;  // keep in sync with attention.py

template <int D>
__global__ void __launch_bounds__(COMBINE_PARTS * D)
attn_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                    const int* __restrict__ seq_lens, const int* __restrict__ slots,
                    half_t* __restrict__ out,  // [B, Hq, D]
                    int Hq, int L, int num_slots, int nsplit, int min_chunk) {
    pdl_launch_dependents();
    pdl_wait();
    const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x % D, part = threadIdx.x / D;
    const int lane = threadIdx.x & 31;
    const long head = (long)b * Hq + h;
    const int slot = slots[b];
    const int len = (slot >= 0 && slot < num_slots) ? min(seq_lens[b], L) : 0;
    if (len <= 0) {
        if (part == 0) out[head * D + d] = 0;
        return;
    }
    const int chunk = split_chunk(len, nsplit, min_chunk);
    const int n = (len + chunk - 1) / chunk;  // splits that had work, <= nsplit <= MAX_SPLITS
    const float* ml = part_ml + head * nsplit * 2;
    __shared__ float s_w[MAX_SPLITS], s_lw[MAX_SPLITS];
    __shared__ float s_o[COMBINE_PARTS][D];
    __shared__ float s_lsum;
    float mx = NEG_INF;  // every split with work saw at least one key: m is finite
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, ml[2 * i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, off));
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float w = exp2f(ml[2 * i] - mx);
        s_w[i] = w;
        s_lw[i] = ml[2 * i + 1] * w;
    }
    __syncthreads();
    if (threadIdx.x >= blockDim.x - 32) {  // the last warp: sum of l * w, fixed order
        float lsum = 0.f;
        for (int i = lane; i < n; i += 32) lsum += s_lw[i];
        lsum = warp_sum(lsum);
        if (lane == 0) s_lsum = lsum;
    }
    const float* po = part_o + head * nsplit * D + d;
    float osum = 0.f;
#pragma unroll 8
    for (int i = part; i < n; i += COMBINE_PARTS) osum += po[(long)i * D] * s_w[i];
    s_o[part][d] = osum;
    __syncthreads();
    if (part != 0) return;
    osum = s_o[0][d];
#pragma unroll
    for (int p = 1; p < COMBINE_PARTS; ++p) osum += s_o[p][d];
    out[head * D + d] = f2h(osum / s_lsum);
}
