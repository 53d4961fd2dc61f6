"""GPU tests of the CUDA kernels against their PyTorch references (app.kernels.reference).

Every output buffer is NaN-poisoned first and must come back fully written; inputs are fresh
random values (never zeros). Error bound: ||out - ref|| / ||ref|| in fp64 below REL_TOL,
which is a few fp16 rounding steps (both sides round to fp16 once; they differ only in the
fp32 summation order). Run on the device machine: python3 -m pytest -m gpu tests/test_kernels_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from app.kernels import (
    DecodeAttentionWorkspace, GemvConfig, decode_attention, gate_up_silu_w3, gate_up_silu_w4, gemv_w3, gemv_w4,
    rms_norm, rope_kv_write,
)
from app.kernels import reference as ref
from app.kernels.loader import KernelArgumentError
from app.kernels.tiles import padded_rows
from app.kernels.w3_tiles import unpack_w3_tiles
from app.kernels.w4_tiles import unpack_w4_tiles

pytestmark = pytest.mark.gpu
REL_TOL = 2e-3
DEV = "cuda"

# (name, N, K): real Qwen2.5-3B / 7B projections (q, k, v fused; lm_head) and odd ones.
GEMV_SHAPES = [
    ("3b_qkv", 2560, 2048), ("3b_o", 2048, 2048), ("3b_down", 2048, 11008), ("3b_lm_head", 151936, 2048),
    ("7b_qkv", 4608, 3584), ("7b_o", 3584, 3584), ("7b_down", 3584, 18944), ("7b_lm_head", 152064, 3584),
    ("odd_77x384", 77, 384), ("one_row", 1, 128), ("odd_1001x1152", 1001, 1152),
]


def rel_err(out: torch.Tensor, want: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "output has NaN/inf: not fully written"
    return float((out.double() - want.double()).norm() / want.double().norm())


def poisoned(*shape, dtype=torch.float16) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def rand_words(*shape, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int32, device=DEV)


def weights(bits: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Random packed words (every bit pattern is a valid weight) and scales ~0.01."""
    g = torch.Generator(device=DEV).manual_seed(seed + 1)
    scales = (torch.rand(n, k // 128, generator=g, device=DEV) * 0.01 + 0.002).half()
    rows = padded_rows(n)  # tile layouts: whole 16-row tiles (random padding rows: scale-less, never read out)
    if bits == 4:
        return rand_words(rows, k // 8, seed=seed), scales
    return rand_words(rows, k // 16, seed=seed), rand_words(rows, k // 32, seed=seed + 2), scales


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(m, k, generator=g, device=DEV).half()


def gemv_w4_tiles_ref(x, tiles, scales, **kw):
    """Random words read as the tile layout; the references read the checkpoint layout."""
    return ref.gemv_w4_ref(x, unpack_w4_tiles(tiles, scales.shape[0]), scales, **kw)


def gate_up_silu_w4_tiles_ref(x, tiles, scales):
    return ref.gate_up_silu_w4_ref(x, unpack_w4_tiles(tiles, scales.shape[0]), scales)


def gemv_w3_tiles_ref(x, a, b, scales, **kw):
    return ref.gemv_w3_ref(x, *unpack_w3_tiles(a, b, scales.shape[0]), scales, **kw)


def gate_up_silu_w3_tiles_ref(x, a, b, scales):
    return ref.gate_up_silu_w3_ref(x, *unpack_w3_tiles(a, b, scales.shape[0]), scales)


GEMV = {4: (gemv_w4, gemv_w4_tiles_ref), 3: (gemv_w3, gemv_w3_tiles_ref)}
GATED = {4: (gate_up_silu_w4, gate_up_silu_w4_tiles_ref), 3: (gate_up_silu_w3, gate_up_silu_w3_tiles_ref)}


# The default split, one warp per block (no block reduction), two tiles per warp, 32 slices.
GEMV_CONFIGS = [None, GemvConfig(tiles=1, warps=1, unroll=4), GemvConfig(tiles=2, warps=2, unroll=2),
                GemvConfig(tiles=1, warps=32)]


def test_the_probe_finds_nvrtc():
    """The check that names a missing NVRTC (CuPy's wheels do not carry it) passes where it is."""
    import cupy

    from app.kernels import loader

    assert loader._nvrtc_reason(cupy) is None
    assert loader.unavailable_reason() is None


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("name,n,k", GEMV_SHAPES, ids=[s[0] for s in GEMV_SHAPES])
def test_gemv_matches_reference(bits, name, n, k):
    op, reference = GEMV[bits]
    w = weights(bits, n, k, seed=n + k)
    for m in (1, 5):
        x = activations(m, k, seed=m)
        want = reference(x, *w)
        for config in GEMV_CONFIGS:
            out = poisoned(m, n)
            op(x, *w, out=out, config=config)
            assert rel_err(out, want) < REL_TOL, (name, m, config)


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("config,m", [(None, 3), (None, 12), (GemvConfig(tiles=1, warps=1), 12),
                                      (GemvConfig(tiles=4, warps=2), 3), (GemvConfig(tiles=1, warps=32), 3),
                                      (GemvConfig(tiles=1, warps=32), 12)])
def test_gemv_bias_and_in_place_residual(bits, config, m):
    """The epilogue's bias and residual (on SM90 the W4 residual is loaded before the main loop)
    for every output layout, one and two column blocks."""
    op, reference = GEMV[bits]
    n, k = 2576, 4096
    w = weights(bits, n, k, seed=11)
    x, bias = activations(m, k, seed=12), activations(1, n, seed=13)[0]
    residual = activations(m, n, seed=14) * 4
    want = reference(x, *w, bias=bias, residual=residual)
    op(x, *w, bias=bias, residual=residual, out=residual, config=config)  # in place
    assert rel_err(residual, want) < REL_TOL


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("inter,k", [(11008, 2048), (18944, 3584), (48, 256)])
@pytest.mark.parametrize("config", [None, GemvConfig(tiles=1, warps=2, unroll=2), GemvConfig(tiles=1, warps=8),
                                    GemvConfig(tiles=2, warps=1, unroll=2)])
def test_gate_up_silu_matches_reference(bits, inter, k, config):
    op, reference = GATED[bits]
    w = weights(bits, 2 * inter, k, seed=inter)
    x = activations(4, k, seed=3) * 2
    out = poisoned(4, inter)
    op(x, *w, out=out, config=config)
    assert rel_err(out, reference(x, *w)) < REL_TOL


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("config", [None, GemvConfig(tiles=2, warps=3, unroll=1), GemvConfig(tiles=4, warps=16, unroll=1),
                                    GemvConfig(tiles=1, warps=6, unroll=2), GemvConfig(tiles=1, warps=32)])
def test_batch_rows_are_bit_equal_to_batch_one(bits, gated, config):
    n, k = (1056, 1152) if gated else (2051, 1152)  # odd N: a padded tile; gated: each half whole tiles
    op = (GATED if gated else GEMV)[bits][0]
    w = weights(bits, n, k, seed=21)
    x = activations(8, k, seed=22)
    singles = [op(x[i:i + 1], *w, config=config) for i in range(8)]
    for m in range(1, 9):
        batched = op(x[:m], *w, config=config)
        for i in range(m):
            assert torch.equal(batched[i], singles[i][0]), (m, i)


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("config", [None, GemvConfig(tiles=1, warps=2, unroll=2), GemvConfig(tiles=2, warps=4),
                                    GemvConfig(tiles=1, warps=32)])
def test_more_than_8_rows_use_a_second_column_block(bits, gated, config):
    """Rows 9..16 (the prefill through the decode graph): right, and rows 0..7 bit-equal to a batch of 8."""
    n, k = (2 * 528, 1152) if gated else (2051, 1152)
    op, reference = (GATED if gated else GEMV)[bits]
    w = weights(bits, n, k, seed=91)
    x = activations(16, k, seed=92)
    eight = op(x[:8], *w, config=config)
    for m in (9, 12, 16):
        out = poisoned(m, n // 2 if gated else n)
        op(x[:m], *w, out=out, config=config)
        assert rel_err(out, reference(x[:m], *w)) < REL_TOL, m
        assert torch.equal(out[:8], eight), m


@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("gated,n,k", [(False, 2560, 2048), (True, 2 * 11008, 2048), (False, 151936, 2048),
                                       (False, 77, 384), (True, 96, 1152)])
def test_staged_x_is_bit_equal_to_x_through_l1(bits, gated, n, k):
    """At batch 1 with K <= 2048 the GEMV stages x in shared memory (GemvOptions.stage_x_bytes);
    the same launch with staging off gives the same bits (the 3B qkv, gate/up, lm_head; odd shapes)."""
    from app.kernels.gemv import GemvOptions

    assert k * 2 <= GemvOptions().stage_x_bytes  # this batch-1 call is staged
    op = (GATED if gated else GEMV)[bits][0]
    w = weights(bits, n, k, seed=81)
    x = activations(1, k, seed=82)
    staged = op(x, *w, out=poisoned(1, n // 2 if gated else n))
    through_l1 = op(x, *w, out=poisoned(1, n // 2 if gated else n), options=GemvOptions(stage_x_bytes=0))
    assert torch.isfinite(staged).all() and torch.equal(staged, through_l1)


def test_more_than_8_rows_refuse_configs_that_would_spill():
    with pytest.raises(KernelArgumentError, match="at most 8 batch rows"):
        gemv_w4(activations(12, 256, seed=1), *weights(4, 64, 256, seed=2), config=GemvConfig(tiles=4, warps=2))


@pytest.mark.parametrize("rows,hidden", [(1, 2048), (5, 3584), (8, 896), (3, 8)])
def test_rms_norm_matches_reference(rows, hidden):
    x, w = activations(rows, hidden, seed=31) * 3, activations(1, hidden, seed=32)[0]
    out = poisoned(rows, hidden)
    rms_norm(x, w, 1e-6, out=out)
    want = ref.rms_norm_ref(x, w, 1e-6)
    assert rel_err(out, want) < REL_TOL
    assert ((out.float() - want.float()).abs() <= 2e-3 * want.float().abs() + 1e-4).all()  # <= ~1 ulp


def test_rms_norm_fused_residual_in_place():
    x, w = activations(4, 2048, seed=33), activations(1, 2048, seed=34)[0]
    residual = activations(4, 2048, seed=35) * 8
    want_y, want_h = ref.rms_norm_ref(x, w, 1e-6, residual=residual)
    y, h = rms_norm(x, w, 1e-6, residual=residual, residual_out=residual, out=poisoned(4, 2048))
    assert h.data_ptr() == residual.data_ptr()
    assert torch.equal(h, want_h)  # fp16(x + r) is exact rounding on both sides
    assert rel_err(y, want_y) < REL_TOL


def rope_tables(d: int, positions: int, theta: float = 1e6):
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(positions, dtype=torch.float64), inv)
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().float().to(DEV), emb.sin().float().to(DEV)  # [P, D] like the engine's


@pytest.mark.parametrize("hq,hkv,d", [(16, 2, 128), (28, 4, 128), (14, 2, 64)])
def test_rope_kv_write_matches_reference(hq, hkv, d):
    slots_n, max_len, tokens = 3, 512, 6
    cos, sin = rope_tables(d, max_len)
    qkv = activations(tokens, (hq + 2 * hkv) * d, seed=41)
    positions = torch.tensor([0, 1, 2, 300, 511, 77], dtype=torch.int32, device=DEV)
    slots = torch.tensor([0, 0, 0, 2, 1, 2], dtype=torch.int32, device=DEV)
    k_cache = activations(1, slots_n * hkv * max_len * d, seed=42).view(slots_n, hkv, max_len, d)
    v_cache = activations(1, slots_n * hkv * max_len * d, seed=43).view(slots_n, hkv, max_len, d)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    q_want = ref.rope_kv_write_ref(qkv, cos, sin, positions, slots, k_want, v_want, num_q_heads=hq, num_kv_heads=hkv)
    q_out = poisoned(tokens, hq, d)
    rope_kv_write(qkv, cos, sin, positions, slots, k_cache, v_cache, num_q_heads=hq, num_kv_heads=hkv, q_out=q_out)
    assert rel_err(q_out, q_want) < REL_TOL
    assert rel_err(k_cache, k_want) < 1e-4  # untouched rows identical, written rows ~1 ulp
    written = torch.zeros(slots_n, max_len, dtype=torch.bool, device=DEV)
    written[slots.long(), positions.long()] = True
    assert torch.equal(k_cache.permute(0, 2, 1, 3)[~written], k_want.permute(0, 2, 1, 3)[~written])
    assert torch.equal(v_cache, v_want)


ATTN_SHAPES = [(16, 2, 128), (28, 4, 128), (32, 8, 128), (9, 3, 64), (14, 2, 64)]


@pytest.mark.parametrize("hq,hkv,d", ATTN_SHAPES)
def test_decode_attention_matches_reference(hq, hkv, d):
    lens = [1, 7, 300, 4096, 32768]
    max_len, batch = 32768, len(lens)
    slots_n = batch + 1
    k_cache = activations(slots_n * hkv, max_len * d, seed=51).view(slots_n, hkv, max_len, d)
    v_cache = activations(slots_n * hkv, max_len * d, seed=52).view(slots_n, hkv, max_len, d)
    q = activations(batch, hq * d, seed=53).view(batch, hq, d) * 2
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    slots = torch.tensor([5, 0, 3, 1, 2], dtype=torch.int32, device=DEV)  # not in batch order
    out = poisoned(batch, hq, d)
    decode_attention(q, k_cache, v_cache, seq_lens, slots, out=out)
    want = ref.decode_attention_ref(q, k_cache, v_cache, seq_lens, slots)
    for b in range(batch):
        assert rel_err(out[b], want[b]) < REL_TOL, lens[b]
    # Each sequence alone (batch 1) gives bit-equal results: nsplit does not depend on the batch.
    for b in range(batch):
        alone = decode_attention(q[b:b + 1], k_cache, v_cache, seq_lens[b:b + 1], slots[b:b + 1])
        assert torch.equal(alone[0], out[b]), lens[b]


@pytest.mark.parametrize("min_chunk", [32, 128])
def test_decode_attention_other_split_lengths_match_reference(min_chunk):
    hq, hkv, d, lens = 28, 4, 128, [1, 100, 520, 3000]
    k_cache = activations(4 * hkv, 3072 * d, seed=81).view(4, hkv, 3072, d)
    v_cache = activations(4 * hkv, 3072 * d, seed=82).view(4, hkv, 3072, d)
    q = activations(4, hq * d, seed=83).view(4, hq, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    slots = torch.tensor([3, 1, 0, 2], dtype=torch.int32, device=DEV)
    out = decode_attention(q, k_cache, v_cache, seq_lens, slots, out=poisoned(4, hq, d), min_chunk=min_chunk)
    want = ref.decode_attention_ref(q, k_cache, v_cache, seq_lens, slots)
    for b in range(4):
        assert rel_err(out[b], want[b]) < REL_TOL, lens[b]


def test_decode_attention_len_zero_gives_zeros():
    k_cache = activations(2 * 2, 64 * 128, seed=54).view(2, 2, 64, 128)
    q = activations(2, 4 * 128, seed=55).view(2, 4, 128)
    out = decode_attention(q, k_cache, k_cache, torch.tensor([0, 3], dtype=torch.int32, device=DEV),
                           torch.tensor([0, 1], dtype=torch.int32, device=DEV), out=poisoned(2, 4, 128))
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isfinite(out[1]).all()


class _Layer:
    """One decoder layer's decode step built from the kernels (the phase-2 runtime's shape)."""

    def __init__(self, hidden=2048, inter=2816, hq=16, hkv=2, d=128, max_len=1024, batch=4):
        self.hq, self.hkv, self.d, self.batch = hq, hkv, d, batch
        self.norm1, self.norm2 = activations(1, hidden, 61)[0], activations(1, hidden, 62)[0]
        self.qkv = weights(4, (hq + 2 * hkv) * d, hidden, 63)
        self.qkv_bias = activations(1, (hq + 2 * hkv) * d, 64)[0]
        self.o = weights(4, hidden, hq * d, 65)
        self.gate_up = weights(3, 2 * inter, hidden, 66)
        self.down = weights(3, hidden, inter, 67)
        self.cos, self.sin = rope_tables(d, max_len)
        self.k_cache = activations(batch * hkv, max_len * d, 68).view(batch, hkv, max_len, d)
        self.v_cache = activations(batch * hkv, max_len * d, 69).view(batch, hkv, max_len, d)
        self.ws = DecodeAttentionWorkspace.allocate(batch, hq, d, 8, DEV)

    def step(self, h, positions, slots):
        """h [B, hidden] residual stream, updated in place."""
        x = rms_norm(h, self.norm1, 1e-6)
        qkv = gemv_w4(x, *self.qkv, bias=self.qkv_bias)
        q = rope_kv_write(qkv, self.cos, self.sin, positions, slots, self.k_cache, self.v_cache,
                          num_q_heads=self.hq, num_kv_heads=self.hkv)
        attn = decode_attention(q, self.k_cache, self.v_cache, positions + 1, slots, workspace=self.ws)
        gemv_w4(attn.view(self.batch, -1), *self.o, residual=h, out=h)
        x = rms_norm(h, self.norm2, 1e-6)
        gemv_w3(gate_up_silu_w3(x, *self.gate_up), *self.down, residual=h, out=h)
        return h


def test_cuda_graph_replay_equals_eager():
    layer = _Layer()
    h = activations(4, 2048, 70)
    positions = torch.tensor([5, 100, 0, 700], dtype=torch.int32, device=DEV)
    slots = torch.tensor([2, 0, 3, 1], dtype=torch.int32, device=DEV)
    caches = (layer.k_cache.clone(), layer.v_cache.clone())
    eager = layer.step(h.clone(), positions, slots).clone()  # also compiles every kernel
    layer.k_cache.copy_(caches[0])
    layer.v_cache.copy_(caches[1])

    static_h, static_pos, static_slots = torch.zeros_like(h), torch.zeros_like(positions), torch.zeros_like(slots)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer.step(static_h, static_pos, static_slots)  # warm-up on the capture stream's side
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        layer.step(static_h, static_pos, static_slots)
    layer.k_cache.copy_(caches[0])
    layer.v_cache.copy_(caches[1])
    static_h.copy_(h)
    static_pos.copy_(positions)
    static_slots.copy_(slots)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(static_h).all()
    assert torch.equal(static_h, eager)


@pytest.mark.parametrize("bits", [4, 3])
def test_gate_up_needs_whole_tiles_per_half(bits):
    with pytest.raises(KernelArgumentError, match="multiple of 32"):
        GATED[bits][0](activations(1, 256, seed=1), *weights(bits, 2 * 40, 256, seed=2))
