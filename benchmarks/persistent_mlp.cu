// A persistent, weight-streaming MLP (probe for docs/KERNELS.md phase 21; not a product kernel).
// Compiled after common.cu and gemv.cu (it reuses their fragments, decode and mma helpers):
// benchmarks/probe_persistent_mlp.py builds the text.
//
// The question: the decode step is a chain of dependent kernels, and each big GEMV reads its
// weights only once its input exists (phase 16: the one window that paid). Weights never
// depend on activations. Here one kernel runs L layers of the MLP at batch 1
//     x = RMSNorm(h); a = silu(x Wg^T) * (x Wu^T); h = h + a Wd^T
// with one block per SM for the whole run. Every warp streams the weight pieces it will consume,
// in consumption order and across the phase boundaries, through a ring of RING shared-memory
// slots (cp.async, one commit group per piece), so while it waits for a phase's input (a grid
// counter) the next pieces are already on their way.
//
// Pieces. One piece = one 16-row tile x one group of 128 inputs: 1 KB of W4 (the tile layout,
// w4_tiles.py: lane l copies vectors l and 32 + l, exactly what load_frag reads) + 32 B of
// scales in a tile-ordered copy [tiles][groups][16 rows] (lanes 0 and 1 copy 16 B each; every
// lane reads its rows g and g + 8 after the wait and a __syncwarp).
// Phase A (gate/up), block b: units u = b, b + G, ... (16 outputs: gate tile u, up tile u);
//   warp w takes group w of both (H = 128 * WARPS: the 3B's hidden 2048 with 16 warps).
// Phase B (down), block b: tiles d = (b + TB) % G, + G, ... < TB (TB = H / 16: the blocks that
//   have one A unit fewer take them first); warp w takes groups w, w + WARPS, ... of d.
// Dependencies: one counter; a block adds 1 after each phase; phase p waits for p * G.
// Activations written inside the kernel are read with __ldcg (L2, never a stale L1 line).

constexpr int PM_WARPS = 16;
constexpr int STAMPS = 7;  // per layer: A waited, A pieces done, A arrived, B waited, a staged, B pieces done, B arrived
#define STAMP(k) \
    if (stamps != nullptr && threadIdx.x == 0) stamps[((long)layer * STAMPS + (k)) * gridDim.x + blockIdx.x] = global_ns()
constexpr int SLOT_VECS = 66;  // 64 weight vectors + 2 of scales (16 rows x fp16)
constexpr int A_UNITS_MAX = 8;  // phase A units a block may own (688 over 132 SMs: 6)
constexpr int A_STAGE_VECS = 4;  // a staged for phase B: I / 8 vectors over 512 threads (I <= 16384)

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The block waits until the counter reaches target (all blocks finished the phase before).
// One thread per block polls: with every lane polling (first run), and with lane 0 of every warp
// (second run), the pollers' requests to the counter's one L2 slice slowed the weight streams
// that share the slice. The block barrier orders the other threads' later loads after the
// acquire; those loads go to L2 (ld.cg / cp.async.cg), never to a stale L1 line.
// A probe must not hang the GPU: after ~2^24 polls (seconds) it traps (a launch error).
__device__ __forceinline__ void wait_counter(const unsigned* counter, unsigned target) {
    if (threadIdx.x == 0) {
        unsigned spins = 0;
        while (ld_acquire(counter) < target)
            if (++spins == (1u << 24)) asm volatile("trap;");
    }
    __syncthreads();
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    return t;
}

// After every warp of the block wrote its outputs: one release add.
__device__ __forceinline__ void arrive(unsigned* counter) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
    }
}

// SM90 bulk copies (BULK, an ablation of the cp.async ring): one lane asks the copy engine for a
// whole piece (1 KB + 32 B, two cp.async.bulk) and the slot's mbarrier counts its bytes in.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void bulk_piece(uint4* slot, const uint4* w, const half_t* s, unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned b = smem_addr(bar);
    asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }"
                 :: "r"(b), "r"(SLOT_VECS * 16) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 1024, [%2];"
                 :: "r"(smem_addr(slot)), "l"(w), "r"(b) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 32, [%2];"
                 :: "r"(smem_addr(slot + 64)), "l"(s), "r"(b) : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned done = 0, spins = 0;
    while (!done) {
        if (++spins == (1u << 26)) asm volatile("trap;");  // a probe must not hang the GPU
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
    }
#endif
}

// Where the warp's piece j of a layer comes from (j < 2 nA: unit j / 2, gate or up; then down).
struct PieceStream {
    const uint4* gu;      // [L][2I/16 tiles][H/128][64] W4 tiles (gate rows, then up rows)
    const half_t* gu_sc;  // [L][2I/16][H/128][16] scales, tile-ordered
    const uint4* dn;      // [L][H/16][I/128][64]
    const half_t* dn_sc;  // [L][H/16][I/128][16]
    int layers, H, I;
    int steps;  // > 0: gu holds records (below), steps of them per warp and layer
    int b, warp, nA, nB, dtile, per_layer;
    int layer, j;  // the next piece to issue

    // The next piece's weights and scales; false past the last layer.
    // Records (steps > 0, an ablation of the layout): every piece is stored once more as one
    // 1,056-byte record, weights then scales, at [layer][step j][block][warp]: the pieces all
    // warps take at step j lie side by side, the order a plain read sweeps the memory in.
    __device__ __forceinline__ bool next(const uint4*& w, const half_t*& s) {
        if (layer >= layers) return false;
        if (steps > 0) {
            const long at = (((long)layer * steps + j) * gridDim.x + b) * PM_WARPS + warp;
            w = gu + at * SLOT_VECS;
            s = reinterpret_cast<const half_t*>(w + 64);
        } else if (j < 2 * nA) {
            const long tile = (long)(j & 1) * (I / 16) + b + (long)(j >> 1) * gridDim.x;
            const long at = ((long)layer * (2 * I / 16) + tile) * (H / GROUP) + warp;
            w = gu + at * 64;
            s = gu_sc + at * 16;
        } else {
            const int grp = warp + (j - 2 * nA) * PM_WARPS;
            const long at = ((long)layer * (H / 16) + dtile) * (I / GROUP) + grp;
            w = dn + at * 64;
            s = dn_sc + at * 16;
        }
        if (++j == per_layer) { j = 0; ++layer; }
        return true;
    }

    template <bool BULK>
    __device__ __forceinline__ void issue(uint4* slot, unsigned long long* bar, int lane);
};

// Copy one piece into a ring slot (any = false past the end: cp.async still commits an empty
// group, so the wait arithmetic stays the same).
template <bool BULK>
__device__ __forceinline__ void issue_piece(uint4* slot, unsigned long long* bar, int lane, bool any,
                                            const uint4* w, const half_t* s) {
    if constexpr (BULK) {
        if (any && lane == 0) bulk_piece(slot, w, s, bar);
    } else {
        if (any) {
            cp_async_16(slot + lane, w + lane);
            cp_async_16(slot + 32 + lane, w + 32 + lane);
            if (lane < 2) cp_async_16(slot + 64 + lane, s + 8 * lane);
        }
        cp_async_commit();
    }
}

template <bool BULK>
__device__ __forceinline__ void PieceStream::issue(uint4* slot, unsigned long long* bar, int lane) {
    const uint4* w = nullptr;
    const half_t* s = nullptr;
    const bool any = next(w, s);
    issue_piece<BULK>(slot, bar, lane, any, w, s);
}

// The ring: piece i sits in slot i % RING; take() issues piece i + RING - 1, then waits for i
// (cp.async: its commit group; BULK: the slot's mbarrier, whose phase flips once per use).
template <int RING, bool BULK, class Stream = PieceStream>
struct Ring {
    uint4* base;               // this warp's RING slots
    unsigned long long* bars;  // BULK: this warp's RING mbarriers
    int next;                  // slot of the next piece to consume
    unsigned parity;           // BULK: bit s = the phase parity slot s completes next
    Stream src;                // next(w, s): the pieces in the order the warp takes them

    __device__ __forceinline__ void issue_at(int slot, int lane) {
        src.template issue<BULK>(base + slot * SLOT_VECS, bars + slot, lane);
    }

    __device__ __forceinline__ const uint4* take(int lane) {
        __syncwarp();  // every lane is done with the slot about to be refilled
        issue_at((next + RING - 1) % RING, lane);
        if constexpr (BULK) {
            mbar_wait(bars + next, (parity >> next) & 1);
            parity ^= 1u << next;
        } else {
            cp_async_wait_group<RING - 1>();
            __syncwarp();  // lanes 0-1's scale copies visible to the warp
        }
        const uint4* slot = base + next * SLOT_VECS;
        next = next + 1 == RING ? 0 : next + 1;
        return slot;
    }
};

// A piece in registers: the lane's fragment and its rows' scales.
struct Piece {
    Frag<4> f;
    float s0, s1;
};

__device__ __forceinline__ Piece read_piece(const uint4* slot, int lane) {
    Piece p;
    p.f.r[0] = slot[lane];
    p.f.r[1] = slot[32 + lane];
    const half_t* sc = reinterpret_cast<const half_t*>(slot + 64);
    p.s0 = h2f(sc[lane >> 2]);
    p.s1 = h2f(sc[(lane >> 2) + 8]);
    return p;
}

// One piece against x: the 16 rows' sums (lane (g, t = 0) holds rows g and g + 8, column 0).
// Two pieces are read before either's math, so their mma chains interleave.
// MATH = false (an ablation, wrong results): no dequantization or mma, only a use of the words.
template <bool MATH = true>
__device__ __forceinline__ void piece_dot(const Piece& p, const uint4 (&xv)[1][4], float& r0, float& r1) {
    float c[1][4] = {};
    if constexpr (MATH) {
        mma_steps<4, 1>(c, p.f, xv);
    } else {
        c[0][0] = (float)(p.f.r[0].x ^ p.f.r[0].w ^ p.f.r[1].y ^ xv[0][0].x);
        c[0][2] = (float)(p.f.r[0].y ^ p.f.r[0].z ^ p.f.r[1].x ^ p.f.r[1].z ^ p.f.r[1].w);
    }
    r0 = p.s0 * c[0][0];
    r1 = p.s1 * c[0][2];
}

__device__ __forceinline__ uint4 ldcg16(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }

// The phases' pieces of work, shared with persistent_layer.cu (all inlined).

// Warp w's 32 values of group w of RMSNorm(h) (lane t: inputs 32t .. 32t + 31), from the chunk
// sums the phase before left; wv: the norm weight's same vectors (constant: loaded before the wait).
__device__ __forceinline__ void load_norm_weight(const half_t* nw, int warp, int t, uint4 (&wv)[4]) {
#pragma unroll
    for (int v = 0; v < 4; ++v) wv[v] = reinterpret_cast<const uint4*>(nw + warp * GROUP + 32 * t)[v];
}

__device__ __forceinline__ void normalized_group(const half_t* h, const float* sums, const uint4 (&wv)[4], int H,
                                                 float eps, int warp, int lane, uint4 (&xv)[1][4]) {
    const int t = lane & 3;
    float s = 0.f;
    for (int c = lane; c < H / NORM_CHUNK; c += 32) s = __fadd_rn(s, __ldcg(sums + c));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, off));
    const float inv = rms_inv(s, H, eps);
#pragma unroll
    for (int v = 0; v < 4; ++v) xv[0][v] = normalize8(ldcg16(h + warp * GROUP + 32 * t + 8 * v), wv[v], inv);
}

// Phase A's pieces: the gate and up tile of each of the block's nA units against x; the 16
// rows' sums of each go to partA[unit][warp][gate 0..15, up 16..31].
template <bool MATH, class R>
__device__ __forceinline__ void gate_up_pieces(R& ring, const uint4 (&xv)[1][4], float* partA, int nA, int warp,
                                               int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int k = 0; k < nA; ++k) {
        float r[2][2];
        const Piece gate = read_piece(ring.take(lane), lane);
        const Piece up = read_piece(ring.take(lane), lane);
        piece_dot<MATH>(gate, xv, r[0][0], r[0][1]);
        piece_dot<MATH>(up, xv, r[1][0], r[1][1]);
        if (t == 0) {
            float* p = partA + (k * PM_WARPS + warp) * 32;
            p[g] = r[0][0];
            p[g + 8] = r[0][1];
            p[16 + g] = r[1][0];
            p[16 + g + 8] = r[1][1];
        }
    }
}

// After a block barrier: warp k adds unit k's slices in warp order (lane = gate/up x row) and
// writes a = silu(gate) * up with the product's roundings.
__device__ __forceinline__ void gate_up_outputs(const float* partA, half_t* a, int nA, int b, int G, int warp,
                                                int lane) {
    if (warp >= nA) return;
    float v = 0.f;
    for (int w = 0; w < PM_WARPS; ++w) v += partA[(warp * PM_WARPS + w) * 32 + lane];
    const float up = __shfl_down_sync(FULL_MASK, v, 16);
    if (lane < 16) {
        const float gate = h2f(f2h(v));
        const float act = h2f(f2h(gate / (1.f + expf(-gate))));
        a[(long)(b + warp * G) * 16 + lane] = f2h(act * h2f(f2h(up)));
    }
}

// n fp16 values (a multiple of 8, at most 8 x 512 x A_STAGE_VECS) copied into shared memory
// by the whole block, all loads in flight at once (no registers held per group).
__device__ __forceinline__ void stage_vector(const half_t* src, uint4* dst, int n) {
    uint4 v[A_STAGE_VECS];
#pragma unroll
    for (int k = 0; k < A_STAGE_VECS; ++k) {
        const int i = threadIdx.x + k * PM_WARPS * 32;
        if (i < n / 8) v[k] = ldcg16(src + 8 * i);
    }
#pragma unroll
    for (int k = 0; k < A_STAGE_VECS; ++k) {
        const int i = threadIdx.x + k * PM_WARPS * 32;
        if (i < n / 8) dst[i] = v[k];
    }
}

// One output tile's pieces: this warp's groups warp, warp + 16, ... (n of them) against the
// staged x, two at a time, added in order; the rows' sums go to partB[warp][16].
template <bool MATH, class R>
__device__ __forceinline__ void tile_pieces(R& ring, const uint4* x_stage, float* partB, int n, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    float acc0 = 0.f, acc1 = 0.f;
    for (int q = 0; q < n; q += 2) {
        const uint4* xs = x_stage + (warp + q * PM_WARPS) * (GROUP / 8) + 4 * t;
        const uint4 x0[1][4] = {{xs[0], xs[1], xs[2], xs[3]}};
        const Piece p0 = read_piece(ring.take(lane), lane);
        float r0, r1;
        if (q + 1 < n) {
            const uint4* ys = xs + PM_WARPS * (GROUP / 8);
            const uint4 x1[1][4] = {{ys[0], ys[1], ys[2], ys[3]}};
            const Piece p1 = read_piece(ring.take(lane), lane);
            float u0, u1;
            piece_dot<MATH>(p0, x0, r0, r1);
            piece_dot<MATH>(p1, x1, u0, u1);
            acc0 += r0;
            acc1 += r1;
            acc0 += u0;
            acc1 += u1;
        } else {
            piece_dot<MATH>(p0, x0, r0, r1);
            acc0 += r0;
            acc1 += r1;
        }
    }
    if (t == 0) {
        partB[warp * 16 + g] = acc0;
        partB[warp * 16 + g + 8] = acc1;
    }
}

// After a block barrier, warp 0: the tile's 16 rows summed over the warps in order (+ bias),
// h += them (the product's roundings), and their chunk sum in common.cu's order.
__device__ __forceinline__ void residual_tile(const float* partB, const half_t* bias, half_t* h, float* sums,
                                              int tile, int lane) {
    float v = 0.f;
    for (int w = 0; w < PM_WARPS; ++w) v += partB[w * 16 + (lane & 15)];
    const int row = tile * 16 + (lane & 15);
    if (bias != nullptr) v += h2f(bias[row]);
    const half_t out = f2h(h2f(f2h(v)) + h2f(__ldcg(h + row)));
    if (lane < 16) h[row] = out;
    const float o = h2f(out), o8 = __shfl_down_sync(FULL_MASK, o, 8);  // lane e pairs rows e, e + 8
    float p = sq_pair(o, o8);
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) p = __fadd_rn(p, __shfl_xor_sync(FULL_MASK, p, off));
    if (lane == 0) sums[tile] = p;
}

template <int RING, bool MATH = true, bool BULK = false>
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
                      int free_run,                // ablation: never wait for the counter (wrong results)
                      int record_steps) {          // ablation: > 0, gu holds the pieces as records (PieceStream)
    extern __shared__ uint4 smem[];
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    const int unitsA = I / 16, tilesB = H / 16, groupsB = I / GROUP;
    const int nA = (unitsA - b + G - 1) / G;  // b < unitsA (the launcher checks G <= unitsA)
    const int dtile = (b + tilesB) % G;
    const int nB = dtile < tilesB ? max(0, (groupsB - warp + PM_WARPS - 1) / PM_WARPS) : 0;
    // Shared memory: the rings, then A's partial sums [unit][warp][gate/up][16], B's [warp][16], a.
    float* partA = reinterpret_cast<float*>(smem + PM_WARPS * RING * SLOT_VECS);
    float* partB = partA + A_UNITS_MAX * PM_WARPS * 32;
    uint4* a_stage = reinterpret_cast<uint4*>(partB + PM_WARPS * 16);  // [I / 8]

    unsigned long long* bars = reinterpret_cast<unsigned long long*>(a_stage + I / 8);  // [warps][RING]
    Ring<RING, BULK> ring{smem + warp * RING * SLOT_VECS, bars + warp * RING, 0, 0u,
                          PieceStream{gu, gu_sc, dn, dn_sc, layers, H, I, record_steps, b, warp, nA, nB, dtile, 2 * nA + nB, 0, 0}};
    if constexpr (BULK) {
        if (lane < RING) mbar_init(ring.bars + lane);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        __syncthreads();
    }
    for (int i = 0; i < RING - 1; ++i) ring.issue_at(i, lane);

    unsigned phase = 0;
    for (int layer = 0; layer < layers; ++layer, phase += 2) {
        // Phase A: x = RMSNorm(h), this warp's group of the block's gate/up units.
        uint4 wv[4];
        load_norm_weight(norm_w + (long)layer * H, warp, t, wv);
        wait_counter(counter, free_run ? 0 : phase * G);
        STAMP(0);
        uint4 xv[1][4];
        normalized_group(h, sums, wv, H, eps, warp, lane, xv);
        gate_up_pieces<MATH>(ring, xv, partA, nA, warp, lane);
        STAMP(1);
        __syncthreads();
        gate_up_outputs(partA, a, nA, b, G, warp, lane);
        arrive(counter);
        STAMP(2);

        // Phase B: h += a Wd^T for tile dtile, this warp's groups of it. A block without a tile
        // waits too: arriving early would count towards the next phase's target while another
        // block may still be in phase A (the runs of 2293ccf and before had that race; their
        // checks passed, the blocks without a tile being among the last to finish A).
        wait_counter(counter, free_run ? 0 : (phase + 1) * G);
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
        arrive(counter);
        STAMP(6);
    }
    if constexpr (!BULK) cp_async_wait_group<0>();
}
