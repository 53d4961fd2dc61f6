// The machinery of the persistent probes (docs/history/kernels/phase-21.md; not product kernels):
// weight pieces streamed through per-warp shared-memory rings, a grid counter between phases,
// and the phases' work on pieces. Compiled after common.cu and gemv.cu (their fragments, decode
// and mma helpers) and before persistent_mlp.cu or persistent_layer.cu.
//
// Pieces. One piece = one 16-row tile x one group of 128 inputs: 1 KB of W4 (the tile layout,
// w4_tiles.py: lane l copies vectors l and 32 + l, exactly what load_frag reads) + 32 B of
// scales in a tile-ordered copy [tiles][groups][16 rows] (lanes 0 and 1 copy 16 B each; every
// lane reads its rows g and g + 8 after the wait and a __syncwarp).
// The ring. Every warp streams the pieces it will consume, in consumption order and across the
// phase boundaries, through RING shared-memory slots (cp.async, one commit group per piece), so
// while it waits for a phase's input the next pieces are already on their way. A kernel gives
// the order as a Stream: next(w, s) -> the next piece's weights and scales.
// Dependencies: one counter; a block adds 1 after each phase; phase p waits for p * G. Every
// block waits for a phase's predecessor before it arrives, with or without work in it.
// Activations written inside a kernel are read with __ldcg (L2, never a stale L1 line).

constexpr int PM_WARPS = 16;
constexpr int RECORD_VECS = 66;       // a piece with shared scales: 64 weight vectors + 2 of scales (16 rows x fp16)
constexpr int LANE_RECORD_VECS = 72;  // a piece with lane scales: 64 weight vectors + 32 lanes x (row g, row g + 8)
constexpr int SLOT_VECS = 72;         // a ring slot holds either
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

// After every warp of the block wrote its outputs: one release add. fence = false (an
// ablation, phase 22: under a saturated stream a fence takes 0.4-1.7 µs) adds without ordering
// the block's writes before it, so readers may see stale values.
__device__ __forceinline__ void arrive(unsigned* counter, bool fence = true) {
    __syncthreads();
    if (threadIdx.x == 0) {
        if (fence) {
            __threadfence();
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
        } else {
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
        }
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
                 :: "r"(b), "r"(RECORD_VECS * 16) : "memory");
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

__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(s), "l"(gmem) : "memory");
}

// Two ways a piece's scales travel (a stream's LANE_SCALES):
// - shared (false): 32 B after the weights, copied by lanes 0 and 1; every lane reads rows g and
//   g + 8 after the wait and a __syncwarp;
// - lane (true, phase 22): a record of LANE_RECORD_VECS, lane l's pair (row g, row g + 8) at word
//   256 + l. Every lane copies and reads only what it copied itself: no predicate, and no
//   __syncwarp between its wait and its reads.
// Copy one piece into a ring slot (any = false: nothing; cp.async still commits one group per
// slot, so the wait arithmetic stays the same).
template <bool BULK>
__device__ __forceinline__ void copy_piece(uint4* slot, unsigned long long* bar, int lane, bool any, const uint4* w,
                                           const half_t* s) {
    if (!any) return;
    if constexpr (BULK) {
        if (lane == 0) bulk_piece(slot, w, s, bar);
    } else {
        cp_async_16(slot + lane, w + lane);
        cp_async_16(slot + 32 + lane, w + 32 + lane);
        if (lane < 2) cp_async_16(slot + 64 + lane, s + 8 * lane);
    }
}

__device__ __forceinline__ void copy_lane_piece(uint4* slot, int lane, const uint4* w) {
    cp_async_16(slot + lane, w + lane);
    cp_async_16(slot + 32 + lane, w + 32 + lane);
    cp_async_4(reinterpret_cast<unsigned*>(slot + 64) + lane, reinterpret_cast<const unsigned*>(w + 64) + lane);
}

// A piece in registers: the lane's fragment and its rows' scales.
struct Piece {
    Frag<4> f;
    float s0, s1;
};

template <bool LANE_SCALES>
__device__ __forceinline__ Piece read_piece(const uint4* slot, int lane) {
    Piece p;
    p.f.r[0] = slot[lane];
    p.f.r[1] = slot[32 + lane];
    if constexpr (LANE_SCALES) {
        const unsigned pair = reinterpret_cast<const unsigned*>(slot + 64)[lane];
        p.s0 = h2f((half_t)(pair & 0xffffu));
        p.s1 = h2f((half_t)(pair >> 16));
    } else {
        const half_t* sc = reinterpret_cast<const half_t*>(slot + 64);
        p.s0 = h2f(sc[lane >> 2]);
        p.s1 = h2f(sc[(lane >> 2) + 8]);
    }
    return p;
}

// The ring: RING slots of PIECES pieces each (PIECES = 2: one commit group, one wait and one
// slot's bookkeeping per two pieces; phase 22: the kernels are bound by instruction issue).
// Slot i % RING holds take i; take() first fills the slot freed by take i - 1 with take
// i + RING - 1, then waits for take i (cp.async: its commit group; BULK: the slot's mbarrier,
// whose phase flips once per use).
//
// A Stream gives next(w, s) and two constants: LANE_SCALES (above) and CONTIGUOUS (a take's
// PIECES pieces are adjacent lane records from w: one next() a slot, and next() is an add).
template <int RING, bool BULK, class Stream, int PIECES = 1>
struct Ring {
    static_assert(!BULK || PIECES == 1, "bulk copies: one piece per slot");
    static constexpr int PIECES_PER_TAKE = PIECES;
    uint4* base;               // this warp's RING slots
    unsigned long long* bars;  // BULK: this warp's RING mbarriers
    int next;                  // slot of the next take
    unsigned parity;           // BULK: bit s = the phase parity slot s completes next
    Stream src;                // next(w, s): the pieces in the order the warp takes them
    int fill = 0;              // slot the next issue fills (next + RING - 1 once primed)

    static_assert(!Stream::CONTIGUOUS || (Stream::LANE_SCALES && !BULK), "contiguous streams carry lane records");

    __device__ __forceinline__ void issue(int lane) {
        uint4* slot = base + fill * PIECES * SLOT_VECS;
        if constexpr (Stream::CONTIGUOUS) {
            const uint4* w = nullptr;
            const half_t* s = nullptr;
            src.next(w, s);
#pragma unroll
            for (int p = 0; p < PIECES; ++p) copy_lane_piece(slot + p * SLOT_VECS, lane, w + p * LANE_RECORD_VECS);
        } else {
#pragma unroll
            for (int p = 0; p < PIECES; ++p) {
                const uint4* w = nullptr;
                const half_t* s = nullptr;
                const bool any = src.next(w, s);
                copy_piece<BULK>(slot + p * SLOT_VECS, bars + fill, lane, any, w, s);
            }
        }
        if constexpr (!BULK) cp_async_commit();
        fill = fill + 1 == RING ? 0 : fill + 1;
    }

    __device__ __forceinline__ void prime(int lane) {
        for (int i = 0; i < RING - 1; ++i) issue(lane);
    }

    __device__ __forceinline__ const uint4* take(int lane) {
        __syncwarp();  // every lane is done with the slot about to be refilled
        issue(lane);
        if constexpr (BULK) {
            mbar_wait(bars + next, (parity >> next) & 1);
            parity ^= 1u << next;
        } else {
            cp_async_wait_group<RING - 1>();
            if constexpr (!Stream::LANE_SCALES) __syncwarp();  // lanes 0-1's scale copies visible to the warp
        }
        const uint4* slot = base + next * PIECES * SLOT_VECS;
        next = next + 1 == RING ? 0 : next + 1;
        return slot;
    }

    __device__ __forceinline__ Piece read(const uint4* slot, int lane) const {
        return read_piece<Stream::LANE_SCALES>(slot, lane);
    }
};


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
        Piece gate, up;
        if constexpr (R::PIECES_PER_TAKE == 2) {
            const uint4* slot = ring.take(lane);
            gate = ring.read(slot, lane);
            up = ring.read(slot + SLOT_VECS, lane);
        } else {
            gate = ring.read(ring.take(lane), lane);
            up = ring.read(ring.take(lane), lane);
        }
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
        const uint4* slot = ring.take(lane);  // PIECES_PER_TAKE 2: pieces q and q + 1 (the stream pads odd n)
        const Piece p0 = ring.read(slot, lane);
        float r0, r1;
        if (q + 1 < n) {
            const uint4* ys = xs + PM_WARPS * (GROUP / 8);
            const uint4 x1[1][4] = {{ys[0], ys[1], ys[2], ys[3]}};
            const Piece p1 = ring.read(R::PIECES_PER_TAKE == 2 ? slot + SLOT_VECS : ring.take(lane), lane);
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

