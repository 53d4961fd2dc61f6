// Tokens drawn at a temperature alone (no top-k / top-p: the tray's default, temperature 0.3),
// in two programmatic launches: temperature_part_kernel<false> (draw_common.cu), then
//
//   temperature_pick_kernel  warp 0 of every block combines the row's slices (the same way in
//                            every block, so all agree on the total and on the slice holding
//                            u x total); that block alone walks its slice in vocabulary order
//                            (contiguous chunks per thread, a block scan of their sums, then
//                            the crossing chunk element by element) and writes the token.
//
// Rows with top-k or top-p are left alone (filtered_draw.cu draws them).

extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
temperature_pick_kernel(const half_t* __restrict__ logits, int ld, int vocab, const float* __restrict__ params,
                        int params_stride, const float* __restrict__ part_m, const float* __restrict__ part_z,
                        long long* __restrict__ tokens) {
    pdl_launch_dependents();
    const int row = blockIdx.y, slices = gridDim.x;
    pdl_wait();
    float temperature, u;
    if (!draws_row<false>(params, params_stride, row, temperature, u)) return;
    // Warp 0 combines the row's slices (the same way in every block): the row's max, and the
    // slice holding u x total.
    __shared__ float s_top;
    __shared__ DrawOwner s_owner;
    if (threadIdx.x < 32) {
        const float m = part_m[row * slices + threadIdx.x], z = part_z[row * slices + threadIdx.x];
        const float top = warp_max(m);
        const DrawOwner owner = owning_slice(slice_softmax_weight(m, z, top), u);
        if (threadIdx.x == 0) s_top = top, s_owner = owner;
    }
    __syncthreads();
    const float top = s_top;
    const DrawOwner owner = s_owner;
    if (top == draw_neg_inf() || owner.slice != blockIdx.x) return;  // -inf: the argmax stays
    const float point = owner.point, owner_before = owner.before;
    const float target = point - owner_before;  // within this slice
    int begin, end;
    slice_bounds(vocab, slices, blockIdx.x, begin, end);
    const int chunk = (end - begin + DRAW_THREADS - 1) / DRAW_THREADS;
    const int first = min(end, begin + threadIdx.x * chunk), last = min(end, first + chunk);
    const half_t* x = logits + (long)row * ld;
    float mine = 0.f;
    int last_positive = -1;
#pragma unroll 8  // loads issued ahead of the math
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
