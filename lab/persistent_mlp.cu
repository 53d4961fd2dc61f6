// A persistent, weight-streaming MLP (probe for docs/history/kernels/phase-21.md; not a product kernel).
// Compiled after common.cu, gemv.cu and persistent_stream.cu (the ring, pieces and phase work):
// lab/probe_persistent_mlp.py builds the text.
//
// The question: the decode step is a chain of dependent kernels, and each big GEMV reads its
// weights only once its input exists (phase 16: the one window that paid). Weights never
// depend on activations. Here one kernel runs L layers of the MLP at batch 1
//     x = RMSNorm(h); a = silu(x Wg^T) * (x Wu^T); h = h + a Wd^T
// with one block per SM for the whole run, every warp streaming its pieces through its ring.
// Phase A (gate/up), block b: units u = b, b + G, ... (16 outputs: gate tile u, up tile u);
//   warp w takes group w of both (H = 128 * WARPS: the 3B's hidden 2048 with 16 warps).
// Phase B (down), block b: tiles d = (b + TB) % G, + G, ... < TB (TB = H / 16: the blocks that
//   have one A unit fewer take them first); warp w takes groups w, w + WARPS, ... of d.

constexpr int STAMPS = 7;  // per layer: A waited, A pieces done, A arrived, B waited, a staged, B pieces done, B arrived
#define STAMP(k) \
    if (stamps != nullptr && threadIdx.x == 0) stamps[((long)layer * STAMPS + (k)) * gridDim.x + blockIdx.x] = global_ns()

// Where a warp's pieces come from, in the order it takes them: per layer 2 nA gate/up pieces
// (unit j / 2, gate then up), then nB down pieces. Four layouts (LAYOUT, a template argument,
// so the stream's next() has no dead branches):
//   0  the tile layout (w4_tiles.py), gate/up and down apart: TileStream;
//   1  records in sweep order: every piece stored once more as one 1,056-byte record (1 KB of
//      tiles, 32 B of scales) at [layer][step][block][warp], so the pieces all warps take at one
//      step lie side by side (phase 21's ablation: it streamed no faster): SweepRecords;
//   2  records per warp: [block][warp][layer][step], each warp's pieces one contiguous run in
//      the order it takes them, padded to the longest warp's steps: WarpRecords;
//   3  the same compact, with lane scales (persistent_stream.cu): next() is one add, no
//      __syncwarp after the wait: RunRecords.
// Phase 22: recomputing each piece's 64-bit index from (layer, j) took ~75 of the phase A loop's
// ~220 instructions a piece; the kernel issues ~45 % of cycles and every instruction counts.

// LAYOUT 0: piece indices that only step forward.
struct TileStream {
    static constexpr bool LANE_SCALES = false, CONTIGUOUS = false;
    const uint4* gu;      // [L][2I/16 tiles][H/128][64] W4 tiles (gate rows, then up)
    const half_t* gu_sc;  // [L][2I/16][H/128][16] scales, tile-ordered
    const uint4* dn;      // [L][H/16][I/128][64]
    const half_t* dn_sc;  // [L][H/16][I/128][16]
    int a, d;             // the next gate piece's index in gu, down piece's in dn
    int a_layer0, d_layer0;  // this layer's first ones
    int up, step, a_layer, d_layer;  // in pieces: gate -> up, unit -> unit + G, layer -> layer
    int layers, nA, nB, per_layer;   // per_layer: 2 nA + nB, + 1 to pad an odd nB (pairs)
    int layer, j;  // the next piece to issue

    __device__ __forceinline__ bool next(const uint4*& w, const half_t*& s) {
        if (layer >= layers) return false;
        bool any = true;
        if (j < 2 * nA) {
            const int at = a + (j & 1 ? up : 0);
            w = gu + (long)at * 64;
            s = gu_sc + (long)at * 16;
            if (j & 1) a += step;
        } else if (j < 2 * nA + nB) {
            w = dn + (long)d * 64;
            s = dn_sc + (long)d * 16;
            d += PM_WARPS;  // groups warp, warp + 16, ...
        } else {
            any = false;  // the pad after an odd nB: the next layer's pairs start a slot
        }
        if (++j == per_layer) {
            j = 0;
            ++layer;
            a = a_layer0 += a_layer;
            d = d_layer0 += d_layer;
        }
        return any;
    }
};

// LAYOUT 1.
struct SweepRecords {
    static constexpr bool LANE_SCALES = false, CONTIGUOUS = false;
    const uint4* rec;  // [L][steps][G][warps][RECORD_VECS]
    int layers, steps, b, warp, per_layer;
    int layer, j;

    __device__ __forceinline__ bool next(const uint4*& w, const half_t*& s) {
        if (layer >= layers) return false;
        const long at = (((long)layer * steps + j) * gridDim.x + b) * PM_WARPS + warp;
        w = rec + at * RECORD_VECS;
        s = reinterpret_cast<const half_t*>(w + 64);
        if (++j == per_layer) { j = 0; ++layer; }
        return true;
    }
};

// LAYOUT 2: the warp's run (region records: stored layers x steps), past the padding after each
// layer's per_layer pieces.
struct WarpRecords {
    static constexpr bool LANE_SCALES = false, CONTIGUOUS = false;
    const uint4* p;  // the next record of [G][warps][L][steps][RECORD_VECS]
    int layers, skip, per_layer;  // skip: (steps - per_layer) x RECORD_VECS
    int layer, j;

    __device__ __forceinline__ bool next(const uint4*& w, const half_t*& s) {
        if (layer >= layers) return false;
        w = p;
        s = reinterpret_cast<const half_t*>(p + 64);
        p += RECORD_VECS;
        if (++j == per_layer) {
            j = 0;
            ++layer;
            p += skip;
        }
        return true;
    }
};

// LAYOUT 3: lane records (LANE_RECORD_VECS), each warp's run compact at [block][warp][layer][j]
// (per layer its 2 nA + nB pieces, + one zero record after an odd nB when a take holds two), so
// next() is one add; past the run the ring copies the next warp's records (the buffer ends with
// RING x PIECES spare ones).
struct RunRecords {
    static constexpr bool LANE_SCALES = true, CONTIGUOUS = true;
    const uint4* p;  // the next take's first record
    int stride;      // PIECES x LANE_RECORD_VECS

    __device__ __forceinline__ bool next(const uint4*& w, const half_t*&) {
        w = p;
        p += stride;
        return true;
    }
};

template <int LAYOUT>
__device__ __forceinline__ auto mlp_stream(const uint4* gu, const half_t* gu_sc, const uint4* dn, const half_t* dn_sc,
                                           int layers, int H, int I, int steps, int region,
                                           const long long* run_offsets, int b, int warp, int nA, int nB,
                                           int dtile, bool pairs) {
    if constexpr (LAYOUT == 0) {
        const int gh = H / GROUP, gi = I / GROUP, a0 = b * gh + warp, d0 = dtile * gi + warp;
        return TileStream{gu, gu_sc, dn, dn_sc, a0, d0, a0, d0, (I / 16) * gh, (int)gridDim.x * gh,
                          (2 * I / 16) * gh, (H / 16) * gi, layers, nA, nB, 2 * nA + nB + (pairs && (nB & 1)), 0, 0};
    } else if constexpr (LAYOUT == 1) {
        return SweepRecords{gu, layers, steps, b, warp, 2 * nA + nB, 0, 0};
    } else if constexpr (LAYOUT == 3) {
        // (Computing the start here, a loop over the blocks before, cost the last blocks ~100 µs
        // at launch: ce98934's run.)
        return RunRecords{gu + run_offsets[b * PM_WARPS + warp] * LANE_RECORD_VECS, (pairs ? 2 : 1) * LANE_RECORD_VECS};
    } else {
        const int per_layer = 2 * nA + nB;
        return WarpRecords{gu + ((long)b * PM_WARPS + warp) * region * RECORD_VECS, layers,
                           (steps - per_layer) * RECORD_VECS, per_layer, 0, 0};
    }
}

template <int RING, bool MATH = true, bool BULK = false, int PIECES = 1, int LAYOUT = 0>
__global__ void __launch_bounds__(PM_WARPS * 32, 1)
persistent_mlp_kernel(const uint4* __restrict__ gu, const half_t* __restrict__ gu_sc,
                      const uint4* __restrict__ dn, const half_t* __restrict__ dn_sc,
                      const half_t* __restrict__ norm_w,  // [L][H]
                      half_t* h,                          // [H] residual row, updated in place
                      float* sums,                        // [H/16] chunk sums of h (common.cu order)
                      half_t* a,                          // [I] gated activations
                      unsigned* counter,                  // zero at launch
                      int layers, int H, int I, float eps,
                      unsigned long long* stamps,  // null, or [layers][STAMPS][G] globaltimer ns (block's thread 0)
                      int ablate,                  // ablations (wrong results): bit 0 never wait for the counter, bit 1 arrive without a fence
                      int record_steps,            // LAYOUT 1, 2: gu holds the records, steps per layer
                      int record_region,           // LAYOUT 2: records per warp (stored layers x steps)
                      const long long* run_offsets) {  // LAYOUT 3: [G][warps] the record each warp's run starts at
    extern __shared__ uint4 smem[];
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    const int unitsA = I / 16, tilesB = H / 16, groupsB = I / GROUP;
    const int nA = (unitsA - b + G - 1) / G;  // b < unitsA (the launcher checks G <= unitsA)
    const int dtile = (b + tilesB) % G;
    const int nB = dtile < tilesB ? max(0, (groupsB - warp + PM_WARPS - 1) / PM_WARPS) : 0;
    // Shared memory: the rings, then A's partial sums [unit][warp][gate/up][16], B's [warp][16], a.
    float* partA = reinterpret_cast<float*>(smem + PM_WARPS * RING * PIECES * SLOT_VECS);
    float* partB = partA + A_UNITS_MAX * PM_WARPS * 32;
    uint4* a_stage = reinterpret_cast<uint4*>(partB + PM_WARPS * 16);  // [I / 8]

    unsigned long long* bars = reinterpret_cast<unsigned long long*>(a_stage + I / 8);  // [warps][RING]
    static_assert(LAYOUT == 0 || LAYOUT == 3 || PIECES == 1, "two pieces a take: the tile and run layouts pad for them");
    using Stream = decltype(mlp_stream<LAYOUT>(gu, gu_sc, dn, dn_sc, 0, 0, 0, 0, 0, nullptr, 0, 0, 0, 0, 0, false));
    Ring<RING, BULK, Stream, PIECES> ring{
        smem + warp * RING * PIECES * SLOT_VECS, bars + warp * RING, 0, 0u,
        mlp_stream<LAYOUT>(gu, gu_sc, dn, dn_sc, layers, H, I, record_steps, record_region, run_offsets, b, warp, nA, nB,
                           dtile, PIECES == 2)};
    if constexpr (BULK) {
        if (lane < RING) mbar_init(ring.bars + lane);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (bulk copies are SM90-only; the probe skips them below)
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
        __syncthreads();
    }
    ring.prime(lane);

    unsigned phase = 0;
    for (int layer = 0; layer < layers; ++layer, phase += 2) {
        // Phase A: x = RMSNorm(h), this warp's group of the block's gate/up units.
        uint4 wv[4];
        load_norm_weight(norm_w + (long)layer * H, warp, t, wv);
        wait_counter(counter, ablate & 1 ? 0 : phase * G);
        STAMP(0);
        uint4 xv[1][4];
        normalized_group(h, sums, wv, H, eps, warp, lane, xv);
        gate_up_pieces<MATH>(ring, xv, partA, nA, warp, lane);
        STAMP(1);
        __syncthreads();
        gate_up_outputs(partA, a, nA, b, G, warp, lane);
        arrive(counter, !(ablate & 2));
        STAMP(2);

        // Phase B: h += a Wd^T for tile dtile, this warp's groups of it. A block without a tile
        // waits too: arriving early would count towards the next phase's target while another
        // block may still be in phase A (the runs of 2293ccf and before had that race; their
        // checks passed, the blocks without a tile being among the last to finish A).
        wait_counter(counter, ablate & 1 ? 0 : (phase + 1) * G);
        if (dtile < tilesB) {  // block-uniform (a warp's nB may be 0 for other shapes)
            STAMP(3);
            stage_vector(a, a_stage, I);  // a: every group this block's tile needs
            __syncthreads();
            STAMP(4);
            tile_pieces<MATH>(ring, a_stage, partB, nB, warp, lane);
            STAMP(5);
            __syncthreads();
            if (warp == 0) residual_tile(partB, nullptr, h, sums, dtile, lane);
        }
        arrive(counter, !(ablate & 2));
        STAMP(6);
    }
    if constexpr (!BULK) cp_async_wait_group<0>();
}
