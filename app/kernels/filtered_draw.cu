// Tokens drawn with top-k and / or top-p, without a sort: temperature_part_kernel<true>
// (draw_common.cu), eight launches of filtered_search_kernel, then filtered_pick_kernel.
// Rows at a temperature alone are left alone (temperature_draw.cu draws them).

// ---- Top-k / top-p rows, without a sort -------------------------------------------------------
//
// A row's logits are ordered by a 16-bit key (the fp16 bits made monotone; NaN as -inf, -0 as
// +0). G(t) is the count (top-k) or the softmax mass (top-p) of the logits whose key is >= t.
// Both filters keep the logits at or above one key: top-k the largest t with count G(t) >= k
// (ties with the k-th value stay), top-p the largest t with mass G(t) >= top_p x Z, Z being the
// mass top-k left (every logit above it has less than top_p x Z ahead of it in sorted order).
// At top-p's key only the first n_keep ties in index order stay, those with less than
// top_p x Z ahead: the stable sort's order of the reference. Each key is found in SEARCH_STEPS
// launches of filtered_search_kernel, each narrowing a key range 16-fold: every slice counts
// G at 17 thresholds lo + c << shift (c = 0..16), and the next launch's blocks all sum the
// slices in the same order and take the largest c whose G reaches the target. Launches 0-3
// find top-k's key, 4-7 top-p's; a row without that filter skips them. The per-launch state
// (lo, shift, whether searching, the target) goes from block 0 of a launch to the next.
// filtered_pick_kernel then draws from the kept logits as temperature_pick_kernel does, a tie
// at the key kept while its rank among the row's ties is below n_keep.

constexpr int SEARCH_THRESHOLDS = 17;
constexpr int SEARCH_STEPS = 4;  // 16 bits, 4 a launch
constexpr int SEARCH_LAUNCHES = 2 * SEARCH_STEPS;  // token_draw.py SEARCH_LAUNCHES
constexpr int STATE_FIELDS = 4;  // token_draw.py STATE_FIELDS: lo, shift, searching, target

__device__ __forceinline__ int logit_key(half_t h) {
    if ((h & 0x7FFF) > 0x7C00) h = 0xFC00;  // NaN -> -inf
    if (h == 0x8000) h = 0;                   // -0 -> +0: equal values, one key
    return (h & 0x8000) ? (~h & 0xFFFF) : (h | 0x8000);
}

__device__ __forceinline__ half_t key_logit(int key) {
    return (half_t)((key & 0x8000) ? (key & 0x7FFF) : (~key & 0xFFFF));
}

struct SearchState { int lo, shift; bool searching; float target; };

__device__ __forceinline__ SearchState load_state(const float* __restrict__ state, int launch, int row, int rows) {
    const float* f = state + ((long)launch * rows + row) * STATE_FIELDS;
    return {(int)f[0], (int)f[1], f[2] != 0.f, f[3]};
}

// What every block of a filtered row needs first, in shared memory: the row's max and softmax
// total (warp 0 over the slices), and G at the 17 thresholds of one launch's partials (each
// warp sums some thresholds over the slices, lane = slice).
struct RowSummary {
    float top, total;
    int g_count[SEARCH_THRESHOLDS];
    float g_mass[SEARCH_THRESHOLDS];
};

__device__ __forceinline__ void summarize_row(const float* __restrict__ pm, const float* __restrict__ pz,
                                              const int* __restrict__ cnt, const float* __restrict__ mass,
                                              RowSummary& out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp == 0) {
        const float m = pm[lane], top = warp_max(m);
        const float total = warp_sum<float>(slice_softmax_weight(m, pz[lane], top));
        if (lane == 0) out.top = top, out.total = total;
    }
    for (int c = warp; c < SEARCH_THRESHOLDS && cnt != nullptr; c += DRAW_WARPS) {
        const int n = warp_sum<int>(cnt[lane * SEARCH_THRESHOLDS + c]);
        const float g = warp_sum<float>(mass[lane * SEARCH_THRESHOLDS + c]);
        if (lane == 0) out.g_count[c] = n, out.g_mass[c] = g;
    }
    __syncthreads();
}

// The largest c in 0..15 with G(lo + c << shift) >= target (c = 0 where rounding leaves none).
__device__ __forceinline__ int search_choice(const RowSummary& row, bool by_count, float target) {
    int chosen = 0;
    for (int c = 1; c < SEARCH_THRESHOLDS - 1; ++c) {
        if ((by_count ? (float)row.g_count[c] : row.g_mass[c]) >= target) chosen = c;
    }
    return chosen;
}

// G at the 17 thresholds over this block's slice -> partials [row][slice][17].
__device__ __forceinline__ void search_pass(const half_t* __restrict__ x, int begin, int end, float temperature,
                                            float top, int lo, int shift, int* __restrict__ out_cnt,
                                            float* __restrict__ out_mass) {
    int cnt[SEARCH_THRESHOLDS];
    float mass[SEARCH_THRESHOLDS];
#pragma unroll
    for (int c = 0; c < SEARCH_THRESHOLDS; ++c) cnt[c] = 0, mass[c] = 0.f;
    for (int base = begin + threadIdx.x; base < end; base += DRAW_THREADS * DRAW_UNROLL) {
        half_t v[DRAW_UNROLL];
#pragma unroll
        for (int k = 0; k < DRAW_UNROLL; ++k) {  // all loads first: one wait for L2, not eight
            const int i = base + k * DRAW_THREADS;
            v[k] = i < end ? x[i] : (half_t)0xFC00;  // -inf: key below every threshold but 0
        }
#pragma unroll
        for (int k = 0; k < DRAW_UNROLL; ++k) {
            if (base + k * DRAW_THREADS >= end) break;
            const int key = logit_key(v[k]);
            const float e = expf(scaled_logit(v[k], temperature) - top);
#pragma unroll
            for (int c = 0; c < SEARCH_THRESHOLDS; ++c) {
                if (key >= lo + (c << shift)) cnt[c] += 1, mass[c] += e;
            }
        }
    }
    __shared__ int warp_cnt[DRAW_WARPS][SEARCH_THRESHOLDS];
    __shared__ float warp_mass[DRAW_WARPS][SEARCH_THRESHOLDS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int c = 0; c < SEARCH_THRESHOLDS; ++c) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            cnt[c] += __shfl_xor_sync(FULL_MASK, cnt[c], off);
            mass[c] += __shfl_xor_sync(FULL_MASK, mass[c], off);
        }
        if (lane == 0) warp_cnt[warp][c] = cnt[c], warp_mass[warp][c] = mass[c];
    }
    __syncthreads();
    if (threadIdx.x < SEARCH_THRESHOLDS) {
        int n = 0;
        float g = 0.f;
        for (int w = 0; w < DRAW_WARPS; ++w) n += warp_cnt[w][threadIdx.x], g += warp_mass[w][threadIdx.x];
        out_cnt[threadIdx.x] = n, out_mass[threadIdx.x] = g;
    }
}

// partials: [2][rows][DRAW_SLICES][17] (launch j writes buffer j % 2, reads (j - 1) % 2);
// state: [SEARCH_LAUNCHES][rows][STATE_FIELDS].
extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
filtered_search_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                       int params_stride, const float* __restrict__ part_m, const float* __restrict__ part_z,
                       int* __restrict__ part_cnt, float* __restrict__ part_mass, float* __restrict__ state,
                       int rows, int launch) {
    pdl_launch_dependents();
    const int row = blockIdx.y;  // rows: the workspace's (>= gridDim.y)
    pdl_wait();
    float temperature, u;
    if (!draws_row<true>(params, params_stride, row, temperature, u)) return;
    const long per_row = (long)DRAW_SLICES * SEARCH_THRESHOLDS;
    const long prev = ((launch + 1) % 2 * (long)rows + row) * per_row;  // the previous launch's buffer
    const bool narrowing = launch % SEARCH_STEPS != 0;
    const SearchState before = load_state(state, launch == 0 ? 0 : launch - 1, row, rows);
    __shared__ RowSummary summary;
    const bool read_prev = launch > 0 && before.searching;  // (launch 4: top-k's last partials)
    summarize_row(part_m + row * DRAW_SLICES, part_z + row * DRAW_SLICES, read_prev ? part_cnt + prev : nullptr,
                  part_mass + prev, summary);
    const float top = summary.top;
    if (top == draw_neg_inf()) return;  // nothing drawable: the argmax stays
    SearchState now;
    if (narrowing) {  // narrow the previous launch's range
        now = before;
        if (before.searching) {
            const int c = search_choice(summary, launch < SEARCH_STEPS, before.target);
            now.lo = before.lo + (c << before.shift), now.shift = before.shift - 4;
        }
    } else if (launch == 0) {  // top-k's search
        const float k = params[2 * params_stride + row];
        now = {0, 12, k > 0.f && k < (float)vocab, k};
    } else {  // top-p's search, within what top-k kept: G at top-k's key, from its last partials
        const float kept = before.searching ? summary.g_mass[search_choice(summary, true, before.target)]
                                            : summary.total;
        const float top_p = params[params_stride + row];
        now = {0, 12, top_p < 1.f, top_p * kept};
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float* f = state + ((long)launch * rows + row) * STATE_FIELDS;
        f[0] = (float)now.lo, f[1] = (float)now.shift, f[2] = now.searching ? 1.f : 0.f, f[3] = now.target;
    }
    if (!now.searching) return;
    int begin, end;
    slice_bounds(vocab, DRAW_SLICES, blockIdx.x, begin, end);
    const long mine = ((launch % 2 * (long)rows + row) * DRAW_SLICES + blockIdx.x) * SEARCH_THRESHOLDS;
    search_pass(logits + (long)row * ld, begin, end, temperature, top, now.lo, now.shift, part_cnt + mine,
                part_mass + mine);
}

// The weight a filtered row draws logit `h` with: its softmax mass above the key, a tie at the
// key while its rank among the row's ties is below n_keep (`rank` counts them), else 0.
__device__ __forceinline__ float kept_weight(half_t h, float temperature, float top, int key, int n_keep, int& rank) {
    const int k = logit_key(h);
    if (k < key) return 0.f;
    if (k == key && rank++ >= n_keep) return 0.f;
    return expf(scaled_logit(h, temperature) - top);
}

extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
filtered_pick_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                     int params_stride, const float* __restrict__ part_m, const float* __restrict__ part_z,
                     const int* __restrict__ part_cnt, const float* __restrict__ part_mass,
                     const float* __restrict__ state, int rows, long long* __restrict__ tokens) {
    pdl_launch_dependents();
    const int row = blockIdx.y;  // rows: the workspace's (>= gridDim.y)
    pdl_wait();
    float temperature, u;
    if (!draws_row<true>(params, params_stride, row, temperature, u)) return;
    // The key both searches ended at (both final launches, 3 and 7, wrote partials buffer 1),
    // then warp 0 over the slices: the ties at the key, the mass above it, how many ties stay,
    // each slice's kept weight and the slice holding u x total. The same in every block.
    const SearchState p = load_state(state, SEARCH_LAUNCHES - 1, row, rows);
    const SearchState k = load_state(state, SEARCH_STEPS - 1, row, rows);
    const SearchState last = p.searching ? p : k;
    const long base = ((long)rows + row) * DRAW_SLICES * SEARCH_THRESHOLDS;
    const int* cnt = part_cnt + base;
    const float* mass = part_mass + base;
    __shared__ RowSummary summary;
    summarize_row(part_m + row * DRAW_SLICES, part_z + row * DRAW_SLICES, last.searching ? cnt : nullptr, mass,
                  summary);
    const float top = summary.top;
    if (top == draw_neg_inf()) return;
    // key -1: neither search ran (top_k >= vocab, top_p 1): everything stays
    const int c = last.searching ? search_choice(summary, !p.searching, last.target) : 0;
    const int key = last.searching ? last.lo + c : -1;
    __shared__ int s_n_keep, s_owner_ties;
    __shared__ DrawOwner s_owner;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int ties = 0;
        float w;
        if (key < 0) {
            w = slice_softmax_weight(part_m[row * DRAW_SLICES + lane], part_z[row * DRAW_SLICES + lane], top);
        } else {
            ties = cnt[lane * SEARCH_THRESHOLDS + c] - cnt[lane * SEARCH_THRESHOLDS + c + 1];
            const float above = summary.g_mass[c + 1];
            const float e_key = expf(scaled_logit(key_logit(key), temperature) - top);
            int n_keep = summary.g_count[c] - summary.g_count[c + 1];  // every tie
            if (p.searching && e_key > 0.f) n_keep = (int)fminf((float)n_keep, ceilf((p.target - above) / e_key));
            const int before = warp_exclusive_scan<int>(ties);
            w = mass[lane * SEARCH_THRESHOLDS + c + 1] + e_key * (float)max(0, min(ties, n_keep - before));
            if (lane == 0) s_n_keep = n_keep;
            ties = before;
        }
        const DrawOwner owner = owning_slice(w, u);
        const int owner_ties = __shfl_sync(FULL_MASK, ties, owner.slice < 0 ? 0 : owner.slice);
        if (lane == 0) s_owner = owner, s_owner_ties = owner_ties;
    }
    __syncthreads();
    const DrawOwner owner_info = s_owner;
    const int owner = owner_info.slice, owner_ties = key < 0 ? 0 : s_owner_ties;
    const int n_keep = key < 0 ? 0 : s_n_keep;
    const float point = owner_info.point, owner_before = owner_info.before;
    if (owner != blockIdx.x) return;
    // Walk the owner's slice: contiguous chunks, their tie counts scanned (the ranks), then
    // their kept weights scanned, then the crossing chunk element by element.
    const float target = point - owner_before;
    int begin, end;
    slice_bounds(vocab, DRAW_SLICES, blockIdx.x, begin, end);
    const int chunk = (end - begin + DRAW_THREADS - 1) / DRAW_THREADS;
    const int first = min(end, begin + threadIdx.x * chunk), stop = min(end, first + chunk);
    const half_t* x = logits + (long)row * ld;
    int my_ties = 0;
#pragma unroll 8  // loads issued ahead of the math
    for (int i = first; i < stop; ++i) my_ties += logit_key(x[i]) == key;
    int owner_slice_ties;
    const int rank0 = owner_ties + block_exclusive_scan<int>(my_ties, owner_slice_ties);
    float mine = 0.f;
    int rank = rank0, last_positive = -1;
#pragma unroll 8  // loads issued ahead of the math
    for (int i = first; i < stop; ++i) {
        const float w = kept_weight(x[i], temperature, top, key, n_keep, rank);
        mine += w;
        if (w > 0.f) last_positive = i;
    }
    float slice_total;
    const float mine_before = block_exclusive_scan<float>(mine, slice_total);
    __shared__ int picked, fallback;
    if (threadIdx.x == 0) picked = 0x7FFFFFFF, fallback = -1;
    __syncthreads();
    if (mine > 0.f && mine_before <= target && target - mine_before < mine) {
        const float want = target - mine_before;  // the same additions as `mine`
        float acc = 0.f;
        rank = rank0;
        for (int i = first; i < stop; ++i) {
            acc += kept_weight(x[i], temperature, top, key, n_keep, rank);
            if (acc > want) {
                atomicMin(&picked, i);
                break;
            }
        }
    }
    if (last_positive >= 0) atomicMax(&fallback, last_positive);
    __syncthreads();
    if (threadIdx.x == 0) {
        const int token = picked != 0x7FFFFFFF ? picked : fallback;
        if (token >= 0) tokens[row] = token;
    }
}
