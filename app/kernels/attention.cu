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
//
// ROPE = true (the decode step): RoPE + KV write (rope.cu) fused into pass 1, one dependent
// launch fewer per layer. q then points at the fused qkv rows [B, (Hq + 2 Hkv) D], not at
// rotated q rows. Each block rotates its G query heads itself, each element once, into
// shared memory (the other half of an element is in lane kl ^ KL/2: one shuffle). A row new
// in this launch is (positions[r], slots[r]) of a row r: every block whose positions include
// one of its own slot's new rows rotates that row's k, writes k and v into the cache, and
// keeps both in shared memory, where its loop reads them. So no block reads a cache row that
// this launch writes, and no block waits for another. In a decode step that is the last split
// of each sequence, which loads its row's k and v beside q and rotates k with q's angles (no
// extra round trip). When the graph prefill runs up to 16 consecutive tokens of one sequence
// as its rows, the blocks of row j also stage the new rows start..start+j-1 of their range
// (stage_new_rows). Precondition (the engine's steps meet it, the launcher says so): B <= 32,
// and the new positions of one slot lie within ROPE_WINDOW consecutive positions (a new row
// outside the window would be read from the cache: memory-safe, but stale). Same bits as
// rope.cu followed by the ROPE = false kernel: the same fp32 rotation (common.cu rope_first /
// rope_second), rounded to fp16 once.
//
// Both passes read the step's inputs (positions, slots, seq_lens) before pdl_wait(): the
// engine writes them with a copy before the step's first kernel, and a programmatic launch
// cannot start before the kernel ahead of it has started. Only q / qkv (pass 1) and the
// partials (pass 2) come from the previous kernel.

constexpr int ATTN_WARPS = 4;
constexpr int MAX_SPLITS = 256;  // keep in sync with attention.py
constexpr int ROPE_WINDOW = 16;  // new positions of one slot per launch, at most (attention.py)
constexpr int ROPE_MAX_ROWS = 32;  // rows per launch with ROPE: one lane each (attention.py)
static_assert(ROPE_MAX_ROWS == 32, "stage_new_rows gives each row one lane of a warp");
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

// SM90 (programmatic launches): while the previous kernel (the qkv GEMV, or RoPE + KV write)
// finishes, ask L2 for the K and V rows [s0, s1) this block will read (contiguous from row0 +
// s0). The rows are loaded after pdl_wait(), when the new token's K/V are in place.
template <int D>
__device__ __forceinline__ void prefetch_rows(const half_t* k_cache, const half_t* v_cache, long row0, int s0,
                                              int s1) {
    const long first = (row0 + s0) * D;
    const int lines = ((s1 - s0) * D * 2 + 127) / 128;
    for (int i = threadIdx.x; i < 2 * lines; i += blockDim.x) {
        const half_t* base = i < lines ? k_cache : v_cache;
        prefetch_l2(reinterpret_cast<const char*>(base + first) + (long)(i < lines ? i : i - lines) * 128);
    }
}

// ROPE: the angles of elements kl * 8 .. kl * 8 + 7 of a head (pair index mod D/2) at ``pos``,
// two 16-byte loads each (the launcher checks the tables' alignment); pos < 0: no rotation.
template <int D>
__device__ __forceinline__ void load_angles(const float* cos_t, const float* sin_t, int pos, int stride, int kl,
                                            float (&c)[8], float (&s)[8]) {
    if (pos < 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            c[e] = 1.f;
            s[e] = 0.f;
        }
        return;
    }
    const long at = (long)pos * stride + (kl * 8) % (D / 2);
    const float4 c0 = *reinterpret_cast<const float4*>(cos_t + at), c1 = *reinterpret_cast<const float4*>(cos_t + at + 4);
    const float4 s0 = *reinterpret_cast<const float4*>(sin_t + at), s1 = *reinterpret_cast<const float4*>(sin_t + at + 4);
    c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w; c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
    s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w; s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
}

// ROPE: rotate-half of one head held 8 elements per lane (lane kl: elements kl * 8 ..), rounded
// to fp16 once, like rope.cu; the other half's elements are in lane kl ^ KL/2 of the same key
// group. Every lane of the warp must call it (shuffles).
template <int KL>
__device__ __forceinline__ uint4 rotated_half8(uint4 raw, const float (&c)[8], const float (&s)[8], int kl) {
    uint4 other;
    other.x = __shfl_xor_sync(FULL_MASK, raw.x, KL / 2);
    other.y = __shfl_xor_sync(FULL_MASK, raw.y, KL / 2);
    other.z = __shfl_xor_sync(FULL_MASK, raw.z, KL / 2);
    other.w = __shfl_xor_sync(FULL_MASK, raw.w, KL / 2);
    float own[8], oth[8], out[8];
    unpack_half8(raw, own);
    unpack_half8(other, oth);
    const bool first_half = kl < KL / 2;
#pragma unroll
    for (int e = 0; e < 8; ++e)
        out[e] = first_half ? rope_first(own[e], oth[e], c[e], s[e]) : rope_second(oth[e], own[e], c[e], s[e]);
    return make_uint4(float2_to_half2(out[0], out[1]), float2_to_half2(out[2], out[3]),
                      float2_to_half2(out[4], out[5]), float2_to_half2(out[6], out[7]));
}

// ROPE: the block's own new row (k rotated, v as it came) into the cache rows and into the
// window at index w (when it is inside); called by one group of KL lanes, 8 elements each.
template <int D>
__device__ __forceinline__ void store_own_row(uint4 k, uint4 v, half_t* k_row, half_t* v_row,
                                              half_t (*sm_k)[D], half_t (*sm_v)[D], int w, int kl) {
    reinterpret_cast<uint4*>(k_row)[kl] = k;
    reinterpret_cast<uint4*>(v_row)[kl] = v;
    if ((unsigned)w < ROPE_WINDOW) {
        reinterpret_cast<uint4*>(sm_k[w])[kl] = k;
        reinterpret_cast<uint4*>(sm_v[w])[kl] = v;
    }
}

// The rows new in this launch that fall in [s0, s1) of this block's slot and kv head (ROPE):
// rotated k and v written to the cache and staged in sm_k / sm_v at (position - first_new).
// Every warp computes the same window from its lanes (lane r = row r); warp w stages the new
// rows whose window index is w mod ATTN_WARPS, except row ``own`` (the block's own row, staged
// by the caller from registers). Returns the window's bit mask (0: no new row).
template <int D>
__device__ __forceinline__ unsigned stage_new_rows(const half_t* qkv, half_t* k_cache, half_t* v_cache,
                                                   const float* cos_t, const float* sin_t, int row_pos,
                                                   bool row_mine, int own, int s0, int s1, int& first_new,
                                                   half_t (*sm_k)[D], half_t (*sm_v)[D], int qkv_stride,
                                                   int k_col, int v_col, long cache_row0, int table_rows,
                                                   int table_stride) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool in_range = row_mine && row_pos >= s0 && row_pos < s1;
    const int lo = __reduce_min_sync(FULL_MASK, in_range ? row_pos : 0x7fffffff);
    if (lo == 0x7fffffff) return 0u;
    first_new = lo;
    const int w = row_pos - lo;
    const bool staged = in_range && w < ROPE_WINDOW;
    unsigned todo = __ballot_sync(FULL_MASK, staged && lane != own && w % ATTN_WARPS == warp);
    while (todo) {
        const int r = __ffs(todo) - 1;
        todo &= todo - 1;
        const int p = __shfl_sync(FULL_MASK, row_pos, r), wr = p - lo;
        const half_t* src = qkv + (long)r * qkv_stride;
        half_t* k_dst = k_cache + (cache_row0 + p) * D;
        if (p < table_rows) {  // rope.cu writes no k for a position past the table either
            for (int i = lane; i < D / 2; i += 32) {
                const float x1 = h2f(src[k_col + i]), x2 = h2f(src[k_col + i + D / 2]);
                const float c = cos_t[(long)p * table_stride + i], sn = sin_t[(long)p * table_stride + i];
                const half_t a = f2h(rope_first(x1, x2, c, sn)), b = f2h(rope_second(x1, x2, c, sn));
                k_dst[i] = a;
                k_dst[i + D / 2] = b;
                sm_k[wr][i] = a;
                sm_k[wr][i + D / 2] = b;
            }
        } else {
            for (int i = lane; i < D; i += 32) sm_k[wr][i] = k_dst[i];
        }
        for (int i = lane; i < D / 8; i += 32) {
            const uint4 v = reinterpret_cast<const uint4*>(src + v_col)[i];
            reinterpret_cast<uint4*>(v_cache + (cache_row0 + p) * D)[i] = v;
            reinterpret_cast<uint4*>(sm_v[wr])[i] = v;
        }
    }
    return __reduce_or_sync(FULL_MASK, staged ? 1u << w : 0u);
}

template <int D, int G, bool ROPE>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_split_kernel(const half_t* __restrict__ q,  // ROPE ? qkv [B, q_stride] : q [B, Hq, D] (q_stride = Hq D)
                  const half_t* __restrict__ k_cache,
                  const half_t* __restrict__ v_cache, const int* __restrict__ seq_lens,
                  const int* __restrict__ slots,
                  float* __restrict__ part_o,    // [B, Hq, nsplit, D]
                  float* __restrict__ part_ml,   // [B, Hq, nsplit, 2]
                  int Hkv, int L, int num_slots, int nsplit, int min_chunk, float scale_log2, int q_stride,
                  const int* __restrict__ positions, const float* __restrict__ cos_t,  // ROPE only
                  const float* __restrict__ sin_t, int table_rows, int table_stride) {
    constexpr int KL = D / 8;     // lanes per key
    constexpr int KPW = 32 / KL;  // keys per warp step
    pdl_launch_dependents();
    const int split = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / KL, kl = lane % KL;
    const int Hq = Hkv * G;
    // The range of positions comes from the step's inputs only (see the header): known before
    // the wait, so is which block holds this row's new position.
    const int slot = slots[b];
    const int len = (slot >= 0 && slot < num_slots) ? min(seq_lens[b], L) : 0;
    const int chunk = split_chunk(len, nsplit, min_chunk);
    const int s0 = split * chunk;
    if (s0 >= len) return;
    const int s1 = min(len, s0 + chunk);
    const long row0 = ((long)slot * Hkv + hkv) * L;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    prefetch_rows<D>(k_cache, v_cache, row0, s0, s1);
#endif
    // ROPE: this lane's angles (elements kl * 8 .. kl * 8 + 7 of a head at this row's position),
    // whether this block holds the row's own new position (then it loads that k and v beside
    // q), and every row's position and slot (lane r: row r).
    float rc[8], rs[8];
    int pos = -1, row_pos = -1, row_slot = -1;
    bool own_new = false;
    if constexpr (ROPE) {
        pos = positions[b];
        const bool in_table = pos >= 0 && pos < table_rows;
        own_new = in_table && pos >= s0 && pos < s1;
        load_angles<D>(cos_t, sin_t, in_table ? pos : -1, table_stride, kl, rc, rs);
        if (lane < gridDim.z) {
            row_pos = positions[lane];
            row_slot = slots[lane];
        }
    }
    pdl_wait();

    uint4 k_own = make_uint4(0, 0, 0, 0), v_own = k_own;
    if (ROPE && own_new) {
        k_own = *reinterpret_cast<const uint4*>(q + (long)b * q_stride + (Hq + hkv) * D + kl * 8);
        v_own = *reinterpret_cast<const uint4*>(q + (long)b * q_stride + (Hq + Hkv + hkv) * D + kl * 8);
    }
    int first_new = 0;
    unsigned new_mask = 0;
    __shared__ __align__(16) half_t sm_k[ROPE ? ROPE_WINDOW : 1][D], sm_v[ROPE ? ROPE_WINDOW : 1][D];
    if constexpr (ROPE) {  // the window of new rows; other rows of this slot (graph prefill) staged here
        new_mask = stage_new_rows<D>(q, const_cast<half_t*>(k_cache), const_cast<half_t*>(v_cache), cos_t, sin_t,
                                     row_pos, row_slot == slot, own_new ? b : -1, s0, s1, first_new, sm_k, sm_v,
                                     q_stride, (Hq + hkv) * D, (Hq + Hkv + hkv) * D, row0, table_rows,
                                     table_stride);
    }

    float qf[G][8], o[G][8], m[G], l[G];
    if constexpr (ROPE) {
        // Each query element is rotated once per block, not once per key group: thread t rotates
        // elements kl * 8 .. kl * 8 + 7 of head t / KL (its own kl, so its angles) into sm_q,
        // rounded to fp16 like rope.cu's q; after the barrier every lane reads its slice of all G.
        __shared__ __align__(16) half_t sm_q[G][D];
        const int head = threadIdx.x / KL;
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (head < G) raw = *reinterpret_cast<const uint4*>(q + (long)b * q_stride + (hkv * G + head) * D + kl * 8);
        const uint4 q_rot = rotated_half8<KL>(raw, rc, rs, kl);  // every lane: the shuffles need the whole warp
        if (head < G) *reinterpret_cast<uint4*>(&sm_q[head][kl * 8]) = q_rot;
        if (own_new) {  // this row's k, rotated with the same angles
            const uint4 k_rot = rotated_half8<KL>(k_own, rc, rs, kl);
            if (warp == 0 && sub == 0)
                store_own_row<D>(k_rot, v_own, const_cast<half_t*>(k_cache) + (row0 + pos) * D,
                                 const_cast<half_t*>(v_cache) + (row0 + pos) * D, sm_k, sm_v, pos - first_new, kl);
        }
        __syncthreads();  // sm_q, and the staged rows
#pragma unroll
        for (int h = 0; h < G; ++h) unpack_half8(*reinterpret_cast<const uint4*>(&sm_q[h][kl * 8]), qf[h]);
    } else {
#pragma unroll
        for (int h = 0; h < G; ++h)
            unpack_half8(*reinterpret_cast<const uint4*>(q + (long)b * q_stride + (hkv * G + h) * D + kl * 8), qf[h]);
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            qf[h][e] *= scale_log2;
            o[h][e] = 0.f;
        }
        m[h] = NEG_INF;
        l[h] = 0.f;
    }

    const int step = ATTN_WARPS * KPW;
    // Rows past s1 read row s0 (valid memory) and are masked out below. ROPE: a row new in this
    // launch comes from shared memory, never from the cache being written.
    auto load_kv = [&](int b0, uint4& k, uint4& v) {
        const int p = b0 + sub;
        if constexpr (ROPE) {
            const unsigned w = (unsigned)(p - first_new);
            if (p < s1 && w < ROPE_WINDOW && ((new_mask >> w) & 1u)) {
                k = *reinterpret_cast<const uint4*>(&sm_k[w][kl * 8]);
                v = *reinterpret_cast<const uint4*>(&sm_v[w][kl * 8]);
                return;
            }
        }
        const long at = (row0 + (p < s1 ? p : s0)) * D + kl * 8;
        k = *reinterpret_cast<const uint4*>(k_cache + at);
        v = *reinterpret_cast<const uint4*>(v_cache + at);
    };
    int base = s0 + warp * KPW;
    uint4 k_next = make_uint4(0, 0, 0, 0), v_next = k_next;
    if (base < s1) load_kv(base, k_next, v_next);
    for (; base < s1; base += step) {
        const bool valid = base + sub < s1;
        float kf[8], vf[8];
        unpack_half8(k_next, kf);
        unpack_half8(v_next, vf);
        if (base + step < s1) load_kv(base + step, k_next, v_next);  // the next keys, while this step computes
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
    const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x % D, part = threadIdx.x / D;
    const int lane = threadIdx.x & 31;
    const long head = (long)b * Hq + h;
    const int slot = slots[b];  // the step's inputs: read before the wait, like pass 1
    const int len = (slot >= 0 && slot < num_slots) ? min(seq_lens[b], L) : 0;
    pdl_wait();  // (out is written after it: a kernel before the previous one may still read it)
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
