// Tokens drawn at a temperature from fp16 logits rows [B, ld], on the device and without a sort:
// the decode step's sampled rows that have no top-k / top-p (the tray's default, temperature
// 0.3). The distribution is softmax(l / T) over the first `vocab` logits of a row; the token
// is the first index whose cumulative weight exceeds u x total (app.engine.sampling.draw),
// u being the row's uniform number. Two programmatic launches, grid (DRAW_SLICES, B):
//
//   temperature_part_kernel<false>  each slice of a row -> (m, z): its largest l / T and the sum of
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

constexpr int DRAW_SLICES = 32;    // temperature_draw.py DRAW_SLICES (grid.x)
constexpr int DRAW_THREADS = 256;  // temperature_draw.py DRAW_THREADS
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

extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
temperature_pick_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                        int params_stride, const float* __restrict__ part_m, const float* __restrict__ part_z,
                        long long* __restrict__ tokens) {
    pdl_launch_dependents();
    const int row = blockIdx.y, slices = gridDim.x;
    pdl_wait();
    float temperature, u;
    if (!draws_row<false>(params, params_stride, row, temperature, u)) return;
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
    const float mine_before = block_exclusive_scan<float>(mine, slice_total);
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
constexpr int SEARCH_LAUNCHES = 2 * SEARCH_STEPS;  // temperature_draw.py SEARCH_LAUNCHES
constexpr int STATE_FIELDS = 4;  // temperature_draw.py STATE_FIELDS: lo, shift, searching, target

__device__ __forceinline__ int logit_key(half_t h) {
    if ((h & 0x7FFF) > 0x7C00) h = 0xFC00;  // NaN -> -inf
    if (h == 0x8000) h = 0;                   // -0 -> +0: equal values, one key
    return (h & 0x8000) ? (~h & 0xFFFF) : (h | 0x8000);
}

__device__ __forceinline__ half_t key_logit(int key) {
    return (half_t)((key & 0x8000) ? (key & 0x7FFF) : (~key & 0xFFFF));
}

// The row's largest scaled logit, from the part kernel's slices.
__device__ __forceinline__ float row_max(const float* __restrict__ pm) {
    float top = draw_neg_inf();
    for (int s = 0; s < DRAW_SLICES; ++s) top = fmaxf(top, pm[s]);
    return top;
}

// Z: the row's softmax mass relative to `top`, slices summed in order.
__device__ __forceinline__ float row_mass(const float* __restrict__ pm, const float* __restrict__ pz, float top) {
    float total = 0.f;
    for (int s = 0; s < DRAW_SLICES; ++s) total += pm[s] == draw_neg_inf() ? 0.f : pz[s] * expf(pm[s] - top);
    return total;
}

struct SearchState { int lo, shift; bool searching; float target; };

__device__ __forceinline__ SearchState load_state(const float* __restrict__ state, int launch, int row, int rows) {
    const float* f = state + ((long)launch * rows + row) * STATE_FIELDS;
    return {(int)f[0], (int)f[1], f[2] != 0.f, f[3]};
}

// The largest c in 0..15 with G(lo + c << shift) >= target, G summed over the slices in order
// (c = 0 where rounding leaves none).
__device__ __forceinline__ int search_choice(const int* __restrict__ cnt, const float* __restrict__ mass,
                                             bool by_count, float target) {
    int chosen = 0;
    for (int c = 1; c < SEARCH_THRESHOLDS - 1; ++c) {
        float g = 0.f;
        for (int s = 0; s < DRAW_SLICES; ++s) {
            const int at = s * SEARCH_THRESHOLDS + c;
            g += by_count ? (float)cnt[at] : mass[at];
        }
        if (g >= target) chosen = c;
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
    for (int i = begin + threadIdx.x; i < end; i += DRAW_THREADS) {
        const half_t h = x[i];
        const int key = logit_key(h);
        const float e = expf(scaled_logit(h, temperature) - top);
#pragma unroll
        for (int c = 0; c < SEARCH_THRESHOLDS; ++c) {
            if (key >= lo + (c << shift)) cnt[c] += 1, mass[c] += e;
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
    const float top = row_max(part_m + row * DRAW_SLICES);
    if (top == draw_neg_inf()) return;  // nothing drawable: the argmax stays
    const long per_row = (long)DRAW_SLICES * SEARCH_THRESHOLDS;
    const long prev = ((launch + 1) % 2 * (long)rows + row) * per_row;  // the previous launch's buffer
    SearchState now;
    if (launch % SEARCH_STEPS != 0) {  // narrow the previous launch's range
        const SearchState before = load_state(state, launch - 1, row, rows);
        now = before;
        if (before.searching) {
            const int c = search_choice(part_cnt + prev, part_mass + prev, launch < SEARCH_STEPS, before.target);
            now.lo = before.lo + (c << before.shift), now.shift = before.shift - 4;
        }
    } else if (launch == 0) {  // top-k's search
        const float k = params[2 * params_stride + row];
        now = {0, 12, k > 0.f && k < (float)vocab, k};
    } else {  // top-p's search, within what top-k kept
        const float top_p = params[params_stride + row];
        float kept = row_mass(part_m + row * DRAW_SLICES, part_z + row * DRAW_SLICES, top);
        const SearchState k = load_state(state, SEARCH_STEPS - 1, row, rows);
        if (k.searching) {  // G at top-k's key, from the last top-k launch's partials
            const int c = search_choice(part_cnt + prev, part_mass + prev, true, k.target);
            kept = 0.f;
            for (int s = 0; s < DRAW_SLICES; ++s) kept += part_mass[prev + s * SEARCH_THRESHOLDS + c];
        }
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
    const float top = row_max(part_m + row * DRAW_SLICES);
    if (top == draw_neg_inf()) return;
    // The key both searches ended at, and the per-slice mass above it and ties at it (every
    // block the same way). Both final launches (3 and 7) wrote partials buffer 1.
    const SearchState p = load_state(state, SEARCH_LAUNCHES - 1, row, rows);
    const SearchState k = load_state(state, SEARCH_STEPS - 1, row, rows);
    const SearchState last = p.searching ? p : k;
    const long base = ((long)rows + row) * DRAW_SLICES * SEARCH_THRESHOLDS;
    const int* cnt = part_cnt + base;
    const float* mass = part_mass + base;
    int key = -1, c = 0;  // -1: neither search ran (top_k >= vocab, top_p 1): everything stays
    if (last.searching) {
        c = search_choice(cnt, mass, !p.searching, last.target);
        key = last.lo + c;
    }
    int ties = 0;
    float above = 0.f;
    for (int s = 0; s < DRAW_SLICES && key >= 0; ++s) {
        ties += cnt[s * SEARCH_THRESHOLDS + c] - cnt[s * SEARCH_THRESHOLDS + c + 1];
        above += mass[s * SEARCH_THRESHOLDS + c + 1];
    }
    const float e_key = key >= 0 ? expf(scaled_logit(key_logit(key), temperature) - top) : 0.f;
    int n_keep = ties;
    if (p.searching && e_key > 0.f) n_keep = (int)fminf((float)ties, ceilf((p.target - above) / e_key));
    // Each slice's kept weight (all of its mass where neither search ran); the slice holding
    // u x total.
    float weights[DRAW_SLICES], total = 0.f;
    int slice_ties[DRAW_SLICES], ties_before = 0;
    for (int s = 0; s < DRAW_SLICES; ++s) {
        const float m = part_m[row * DRAW_SLICES + s];
        slice_ties[s] = key < 0 ? 0 : cnt[s * SEARCH_THRESHOLDS + c] - cnt[s * SEARCH_THRESHOLDS + c + 1];
        const int kept_ties = max(0, min(slice_ties[s], n_keep - ties_before));
        weights[s] = key < 0 ? (m == draw_neg_inf() ? 0.f : part_z[row * DRAW_SLICES + s] * expf(m - top))
                             : mass[s * SEARCH_THRESHOLDS + c + 1] + e_key * (float)kept_ties;
        ties_before += slice_ties[s];
        total += weights[s];
    }
    const float point = u * total;
    float before = 0.f, owner_before = 0.f;
    int owner = -1, owner_ties = 0;
    ties_before = 0;
    for (int s = 0; s < DRAW_SLICES; ++s) {
        if (weights[s] > 0.f && before <= point) owner = s, owner_before = before, owner_ties = ties_before;
        before += weights[s];
        ties_before += slice_ties[s];
    }
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
    for (int i = first; i < stop; ++i) my_ties += logit_key(x[i]) == key;
    int owner_slice_ties;
    const int rank0 = owner_ties + block_exclusive_scan<int>(my_ties, owner_slice_ties);
    float mine = 0.f;
    int rank = rank0, last_positive = -1;
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
