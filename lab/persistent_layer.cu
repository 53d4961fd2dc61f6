// A whole decode layer as phases of one persistent kernel (probe for docs/history/kernels/phase-21.md;
// not a product kernel). Compiled after common.cu, gemv.cu and persistent_stream.cu (the ring,
// pieces and phase work, shared with persistent_mlp.cu): lab/probe_persistent_layer.py
// builds the text.
//
// Per layer, at batch 1 (Qwen2 shapes with head_dim 128 and H = 128 x 16 warps, e.g. the 3B):
//   P0 qkv      = RMSNorm(h) Wqkv^T + bias        block b: tiles b, b + G, ...; warp w: group w
//   P1 split    RoPE of q and the new k, k and v written into the cache at pos; block b < Hkv x
//               used: kv head b / used, positions [s chunk, (s + 1) chunk) of the n = pos + 1
//               (s = b % used): partial softmax (m, l) and sum of p v per query head of the group
//   P2 combine  block b < Hq: head b's splits merged -> attn
//   P3 o        h += attn Wo^T                    one tile per block (as the down projection)
//   P4 gate/up  a = silu(x Wg^T) * (x Wu^T), x = RMSNorm(h)   (as persistent_mlp.cu's phase A)
//   P5 down     h += a Wd^T, chunk sums of h for the next layer's norm (as its phase B)
// Every warp streams its pieces (qkv, o, gate/up, down) through its ring in that order, across
// the phases: while P1 and P2 run (no weights), the rings fill with the o and gate/up pieces.

constexpr int HEAD_DIM = 128;
constexpr int MAX_CHUNK = 32;        // positions per split (the attention scratch in a_stage)
constexpr int LAYER_STAMPS = 12;     // per phase: waited, arrived
#define LSTAMP(k) \
    if (stamps != nullptr && threadIdx.x == 0) \
    stamps[((long)layer * LAYER_STAMPS + (k)) * gridDim.x + blockIdx.x] = global_ns()

// The warp's pieces of a layer: nQ qkv tiles, nO o tiles (0 or 1), 2 nA gate/up, nB down.
struct LayerStream {
    static constexpr bool LANE_SCALES = false, CONTIGUOUS = false;
    const uint4* qkv_w;  // [L][NQKV/16][H/128][64] W4 tiles;  scales tile-ordered [..][16]
    const half_t* qkv_s;
    const uint4* o_w;    // [L][H/16][H/128][64]
    const half_t* o_s;
    const uint4* gu;     // [L][2I/16][H/128][64] (gate tiles, then up)
    const half_t* gu_sc;
    const uint4* dn;     // [L][H/16][I/128][64]
    const half_t* dn_sc;
    int layers, H, I, qkv_tiles;
    int steps;  // > 0: qkv_w holds every piece as a record at [layer][step][block][warp] (PieceStream)
    int b, warp, nQ, nO, nA, nB, otile, dtile, per_layer;
    int layer, j;  // the next piece to issue

    __device__ __forceinline__ bool next(const uint4*& w, const half_t*& s) {
        if (layer >= layers) return false;
        const int G = gridDim.x, gh = H / GROUP;
        int k = j;
        long at;
        if (steps > 0) {
            at = (((long)layer * steps + j) * G + b) * PM_WARPS + warp;
            w = qkv_w + at * RECORD_VECS;
            s = reinterpret_cast<const half_t*>(w + 64);
        } else if (k < nQ) {
            at = ((long)layer * qkv_tiles + b + (long)k * G) * gh + warp;
            w = qkv_w + at * 64;
            s = qkv_s + at * 16;
        } else if ((k -= nQ) < nO) {
            at = ((long)layer * (H / 16) + otile) * gh + warp;
            w = o_w + at * 64;
            s = o_s + at * 16;
        } else if ((k -= nO) < 2 * nA) {
            const long tile = (long)(k & 1) * (I / 16) + b + (long)(k >> 1) * G;
            at = ((long)layer * (2 * I / 16) + tile) * gh + warp;
            w = gu + at * 64;
            s = gu_sc + at * 16;
        } else {
            k -= 2 * nA;
            at = ((long)layer * (H / 16) + dtile) * (I / GROUP) + warp + k * PM_WARPS;
            w = dn + at * 64;
            s = dn_sc + at * 16;
        }
        if (++j == per_layer) { j = 0; ++layer; }
        return true;
    }
};

// P0's pieces: n tiles (b, b + G, ...) of this warp's group against x; rows to partA[k][warp][16].
template <class R>
__device__ __forceinline__ void plain_pieces(R& ring, const uint4 (&xv)[1][4], float* partA, int n, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int k = 0; k < n; ++k) {
        float r0, r1;
        piece_dot<true>(ring.read(ring.take(lane), lane), xv, r0, r1);
        if (t == 0) {
            partA[(k * PM_WARPS + warp) * 16 + g] = r0;
            partA[(k * PM_WARPS + warp) * 16 + g + 8] = r1;
        }
    }
}

// P1 for one (kv head, split): the block's scratch is a_stage (phases never overlap).
struct Attention {
    const half_t* qkv;  // [NQKV]: q heads, k heads, v heads
    half_t* k_cache;    // this layer's [Hkv][max_len][D]
    half_t* v_cache;
    const float* cos;   // [positions][rope_stride]
    const float* sin;
    float* part_o;      // [Hq][splits][D]
    float* part_ml;     // [Hq][splits][2]
    int Hq, Hkv, max_len, rope_stride, pos, splits, chunk;
    float scale;
};

__device__ __forceinline__ void attention_split(const Attention& A, int kh, int split, uint4* scratch) {
    const int gq = A.Hq / A.Hkv, tid = threadIdx.x, nthreads = blockDim.x;
    const int t0 = split * A.chunk, t1 = min(t0 + A.chunk, A.pos + 1), T = t1 - t0;
    float* qs = reinterpret_cast<float*>(scratch);           // [gq][D], rotated q through fp16
    half_t* ks = reinterpret_cast<half_t*>(qs + gq * HEAD_DIM);  // [chunk][D]
    half_t* vs = ks + MAX_CHUNK * HEAD_DIM;                  // [chunk][D]
    float* ps = reinterpret_cast<float*>(vs + MAX_CHUNK * HEAD_DIM);  // [gq][chunk]
    const float* cr = A.cos + (long)A.pos * A.rope_stride;
    const float* sr = A.sin + (long)A.pos * A.rope_stride;
    constexpr int HALF = HEAD_DIM / 2;
    for (int i = tid; i < gq * HALF; i += nthreads) {  // q: one rotated pair per thread
        const int hh = i / HALF, d = i % HALF;
        const half_t* q = A.qkv + (kh * gq + hh) * HEAD_DIM;
        const float x1 = h2f(__ldcg(q + d)), x2 = h2f(__ldcg(q + d + HALF)), c = cr[d], s = sr[d];
        qs[hh * HEAD_DIM + d] = h2f(f2h(rope_first(x1, x2, c, s)));
        qs[hh * HEAD_DIM + d + HALF] = h2f(f2h(rope_second(x1, x2, c, s)));
    }
    const long row0 = (long)kh * A.max_len;  // this kv head's first cache row
    for (int i = tid; i < T * (HEAD_DIM / 8); i += nthreads) {  // cached k / v rows, 16 B each
        const int r = i / (HEAD_DIM / 8), v = i % (HEAD_DIM / 8);
        if (t0 + r == A.pos) continue;  // the new token: below
        reinterpret_cast<uint4*>(ks + r * HEAD_DIM)[v] = ldcg16(A.k_cache + (row0 + t0 + r) * HEAD_DIM + 8 * v);
        reinterpret_cast<uint4*>(vs + r * HEAD_DIM)[v] = ldcg16(A.v_cache + (row0 + t0 + r) * HEAD_DIM + 8 * v);
    }
    if (A.pos < t1) {  // this split holds the new token: rotate k, store k and v in the cache
        const int r = A.pos - t0;
        const half_t* k = A.qkv + (A.Hq + kh) * HEAD_DIM;
        const half_t* v = A.qkv + (A.Hq + A.Hkv + kh) * HEAD_DIM;
        half_t* kc = A.k_cache + (row0 + A.pos) * HEAD_DIM;
        half_t* vc = A.v_cache + (row0 + A.pos) * HEAD_DIM;
        if (tid < HALF) {
            const float x1 = h2f(__ldcg(k + tid)), x2 = h2f(__ldcg(k + tid + HALF)), c = cr[tid], s = sr[tid];
            const half_t a = f2h(rope_first(x1, x2, c, s)), b = f2h(rope_second(x1, x2, c, s));
            ks[r * HEAD_DIM + tid] = kc[tid] = a;
            ks[r * HEAD_DIM + tid + HALF] = kc[tid + HALF] = b;
        } else if (tid < HALF + HEAD_DIM) {
            const int d = tid - HALF;
            vs[r * HEAD_DIM + d] = vc[d] = __ldcg(v + d);
        }
    }
    __syncthreads();
    for (int base = 0; base < T * gq; base += nthreads / 4) {  // scores: 4 threads per (position, head)
        const int i = base + tid / 4, r = i % T, hh = i / T, part = tid & 3;
        float dot = 0.f;
        if (i < T * gq)
#pragma unroll 8
            for (int d = part * 32; d < part * 32 + 32; ++d) dot += qs[hh * HEAD_DIM + d] * h2f(ks[r * HEAD_DIM + d]);
        dot += __shfl_xor_sync(FULL_MASK, dot, 1);  // every thread of the block runs every round
        dot += __shfl_xor_sync(FULL_MASK, dot, 2);
        if (i < T * gq && part == 0) ps[hh * MAX_CHUNK + r] = dot * A.scale;
    }
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    if (warp < gq) {  // softmax of head `warp` over the split: m, exp, l
        float m = -__int_as_float(0x7f800000);
        for (int r = lane; r < T; r += 32) m = fmaxf(m, ps[warp * MAX_CHUNK + r]);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, off));
        float l = 0.f;
        for (int r = lane; r < T; r += 32) {
            const float p = expf(ps[warp * MAX_CHUNK + r] - m);
            ps[warp * MAX_CHUNK + r] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) {
            float* ml = A.part_ml + ((long)(kh * gq + warp) * A.splits + split) * 2;
            ml[0] = m;
            ml[1] = l;
        }
    }
    __syncthreads();
    for (int o = tid; o < gq * HEAD_DIM; o += nthreads) {  // sum of p v per (head, dim)
        const int hh = o / HEAD_DIM, d = o % HEAD_DIM;
        float acc = 0.f;
        for (int r = 0; r < T; ++r) acc += ps[hh * MAX_CHUNK + r] * h2f(vs[r * HEAD_DIM + d]);
        A.part_o[((long)(kh * gq + hh) * A.splits + split) * HEAD_DIM + d] = acc;
    }
}

// P2 for query head `head`: its used splits merged; threads 0..D-1, one output each.
__device__ __forceinline__ void attention_combine(const Attention& A, int head, int used, half_t* attn) {
    const int d = threadIdx.x;
    if (d >= HEAD_DIM) return;
    const float* ml = A.part_ml + (long)head * A.splits * 2;
    float m = -__int_as_float(0x7f800000);
    for (int s = 0; s < used; ++s) m = fmaxf(m, __ldcg(ml + 2 * s));
    float l = 0.f, o = 0.f;
    for (int s = 0; s < used; ++s) {
        const float e = expf(__ldcg(ml + 2 * s) - m);
        l += __ldcg(ml + 2 * s + 1) * e;
        o += __ldcg(A.part_o + ((long)head * A.splits + s) * HEAD_DIM + d) * e;
    }
    attn[head * HEAD_DIM + d] = f2h(o / l);
}

template <int RING>
__global__ void __launch_bounds__(PM_WARPS * 32, 1)
persistent_layer_kernel(const uint4* __restrict__ qkv_w, const half_t* __restrict__ qkv_s,
                        const half_t* __restrict__ qkv_bias,  // [L][NQKV]
                        const uint4* __restrict__ o_w, const half_t* __restrict__ o_s,
                        const uint4* __restrict__ gu, const half_t* __restrict__ gu_sc,
                        const uint4* __restrict__ dn, const half_t* __restrict__ dn_sc,
                        const half_t* __restrict__ ln1, const half_t* __restrict__ ln2,  // [L][H]
                        half_t* h, float* sums,             // [H] residual row, [H/16] its chunk sums
                        half_t* qkv, half_t* attn, half_t* a,  // [NQKV], [Hq D], [I] activations
                        half_t* k_cache, half_t* v_cache,  // [L][Hkv][max_len][D]
                        const float* __restrict__ cos, const float* __restrict__ sin, int rope_stride,
                        float* part_o, float* part_ml,      // [Hq][splits][D], [Hq][splits][2]
                        unsigned* counter,                  // zero at launch
                        int layers, int H, int I, int Hq, int Hkv, int max_len, int pos, int splits, int chunk,
                        float eps, float scale,
                        unsigned long long* stamps,  // null, or [layers][LAYER_STAMPS][G] globaltimer ns
                        int record_steps) {          // > 0: qkv_w holds the pieces as records (LayerStream)
    extern __shared__ uint4 smem[];
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
    const int G = gridDim.x, b = blockIdx.x;
    const int nqkv = (Hq + 2 * Hkv) * HEAD_DIM, qkv_tiles = nqkv / 16, tilesH = H / 16;
    const int nQ = max(0, (qkv_tiles - b + G - 1) / G);
    const int otile = (b + tilesH) % G, nO = otile < tilesH ? 1 : 0;
    const int nA = (I / 16 - b + G - 1) / G;
    const int dtile = otile;  // the blocks with an o tile also take the down tile of the same rows
    const int nB = dtile < tilesH ? max(0, (I / GROUP - warp + PM_WARPS - 1) / PM_WARPS) : 0;
    const int used = (pos + chunk) / chunk;  // splits holding positions 0..pos
    float* partA = reinterpret_cast<float*>(smem + PM_WARPS * RING * SLOT_VECS);
    float* partB = partA + A_UNITS_MAX * PM_WARPS * 32;
    uint4* a_stage = reinterpret_cast<uint4*>(partB + PM_WARPS * 16);  // [I / 8]; P1's scratch

    Ring<RING, false, LayerStream> ring{
        smem + warp * RING * SLOT_VECS, nullptr, 0, 0u,
        LayerStream{qkv_w, qkv_s, o_w, o_s, gu, gu_sc, dn, dn_sc, layers, H, I, qkv_tiles, record_steps,
                    b, warp, nQ, nO, nA, nB, otile, dtile, nQ + nO + 2 * nA + nB, 0, 0}};
    ring.prime(lane);

    for (int layer = 0; layer < layers; ++layer) {
        const unsigned p0 = 6u * layer;
        const long lh = (long)layer * H;
        Attention att{qkv, k_cache + (long)layer * Hkv * max_len * HEAD_DIM, v_cache + (long)layer * Hkv * max_len * HEAD_DIM,
                      cos, sin, part_o, part_ml, Hq, Hkv, max_len, rope_stride, pos, splits, chunk, scale};
        uint4 wv[4], xv[1][4];

        // P0: qkv = RMSNorm(h) Wqkv^T + bias.
        load_norm_weight(ln1 + lh, warp, t, wv);
        wait_counter(counter, p0 * G);
        LSTAMP(0);
        normalized_group(h, sums, wv, H, eps, warp, lane, xv);
        plain_pieces(ring, xv, partA, nQ, warp, lane);
        __syncthreads();
        if (warp < nQ) {  // tile b + warp G: its 16 rows summed over the warps in order, + bias
            float v = 0.f;
            for (int w = 0; w < PM_WARPS; ++w) v += partA[(warp * PM_WARPS + w) * 16 + (lane & 15)];
            const int row = (b + warp * G) * 16 + (lane & 15);
            if (lane < 16) qkv[row] = f2h(v + h2f(qkv_bias[(long)layer * nqkv + row]));
        }
        arrive(counter);
        LSTAMP(1);

        // P1: RoPE, the cache write and the attention of one (kv head, split).
        wait_counter(counter, (p0 + 1) * G);
        LSTAMP(2);
        if (b < Hkv * used) attention_split(att, b / used, b % used, a_stage);
        arrive(counter);
        LSTAMP(3);

        // P2: the splits merged per query head.
        wait_counter(counter, (p0 + 2) * G);
        LSTAMP(4);
        if (b < Hq) attention_combine(att, b, used, attn);
        arrive(counter);
        LSTAMP(5);

        // P3: h += attn Wo^T (one tile), the chunk sums for P4's norm.
        wait_counter(counter, (p0 + 3) * G);
        LSTAMP(6);
        if (nO) {
            stage_vector(attn, a_stage, Hq * HEAD_DIM);
            __syncthreads();
            tile_pieces<true>(ring, a_stage, partB, 1, warp, lane);
            __syncthreads();
            if (warp == 0) residual_tile(partB, nullptr, h, sums, otile, lane);
        }
        arrive(counter);
        LSTAMP(7);

        // P4: a = silu(x Wg^T) * (x Wu^T), x = RMSNorm(h).
        load_norm_weight(ln2 + lh, warp, t, wv);
        wait_counter(counter, (p0 + 4) * G);
        LSTAMP(8);
        normalized_group(h, sums, wv, H, eps, warp, lane, xv);
        gate_up_pieces<true>(ring, xv, partA, nA, warp, lane);
        __syncthreads();
        gate_up_outputs(partA, a, nA, b, G, warp, lane);
        arrive(counter);
        LSTAMP(9);

        // P5: h += a Wd^T, the chunk sums for the next layer's norm.
        wait_counter(counter, (p0 + 5) * G);
        LSTAMP(10);
        if (dtile < tilesH) {
            stage_vector(a, a_stage, I);
            __syncthreads();
            tile_pieces<true>(ring, a_stage, partB, nB, warp, lane);
            __syncthreads();
            if (warp == 0) residual_tile(partB, nullptr, h, sums, dtile, lane);
        }
        arrive(counter);
        LSTAMP(11);
    }
    cp_async_wait_group<0>();
}
