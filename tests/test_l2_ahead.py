"""L2 prefetches of a later GEMV's weights (app.engine.cuda.l2_ahead, gemv.cu ``ahead``): which
GEMV asks for which weight on the CPU; on a GPU, that asking changes no output bit."""

from __future__ import annotations

import pytest
import torch

from app.engine.cuda import l2_ahead
from app.engine.cuda.weights import LayerWeights, LinearWeight

MB = 1 << 20


def w4(n: int, k: int, device="meta") -> LinearWeight:
    """A W4 weight of this shape (meta tensors: the plan reads sizes only)."""
    return LinearWeight(4, n, k, qa=torch.empty(n, k // 8, dtype=torch.int32, device=device),
                        scales=torch.empty(n, k // 128, dtype=torch.float16, device=device))


def w3(n: int, k: int) -> LinearWeight:
    return LinearWeight(3, n, k, qa=torch.empty(n, k // 16, dtype=torch.int32, device="meta"),
                        qb=torch.empty(n, k // 32, dtype=torch.int32, device="meta"),
                        scales=torch.empty(n, k // 128, dtype=torch.float16, device="meta"))


def layer(h: int, inter: int, gate_up_bits: int = 4) -> LayerWeights:
    norm = torch.empty(h, dtype=torch.float16, device="meta")
    mlp = w4 if gate_up_bits == 4 else w3
    return LayerWeights(norm, norm, w4(h + 2 * 256, h), w4(h, h), mlp(2 * inter, h), mlp(h, inter))


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_each_gemv_asks_for_the_weights_the_sites_name():
    layers = [layer(2048, 11008) for _ in range(3)]  # the 3B's shapes: gate/up 22 MB, down 11 MB
    plan = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True, sites=frozenset(l2_ahead.ALL_SITES))
    for i, ahead in enumerate(plan):
        assert ahead.qkv == l2_ahead.weight_tensors(layers[i].o) + l2_ahead.weight_tensors(layers[i].gate_up)
        assert ahead.gate_up == l2_ahead.weight_tensors(layers[i].down)
        # the last layer's down has no next qkv (the head is far too big for L2)
        assert ahead.down == (l2_ahead.weight_tensors(layers[i + 1].qkv) + l2_ahead.weight_tensors(layers[i + 1].gate_up)
                              if i < 2 else ())
    assert nbytes(plan[0].gate_up) == 2048 * 11008 // 2 + 2048 * 86 * 2  # tiles + scales


def test_of_a_weight_larger_than_the_l2_share_only_the_first_blocks_rows(monkeypatch):
    # the 7B `mixed` shapes: gate/up (W3) 51 MB, down 26.5 MB, against an H200's 50 MiB of L2
    layers = [layer(3584, 18944, gate_up_bits=3) for _ in range(2)]
    plan = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True, sites=frozenset(l2_ahead.ALL_SITES))
    o, gate_up = layers[0].o, layers[0].gate_up
    assert plan[0].qkv[:2] == l2_ahead.weight_tensors(o)  # o (6.4 MB) whole
    spans = plan[0].qkv[2:]  # a, b, scales: each the leading rows of the gate half and of the up half
    assert len(spans) == 6 and nbytes(spans) <= 25 * MB
    rows = spans[0].shape[0]
    assert rows % 16 == 0 and 8000 < rows < 18944
    half = 18944
    for t, (gate_rows, up_rows) in zip(l2_ahead.weight_tensors(gate_up), zip(spans[::2], spans[1::2])):
        assert gate_rows.data_ptr() == t.data_ptr() and up_rows.data_ptr() == t[half].data_ptr()
        assert gate_rows.shape == up_rows.shape == (rows, t.shape[1])
    assert len(plan[0].gate_up) == 3 and nbytes(plan[0].gate_up) <= 25 * MB  # the down's leading rows
    monkeypatch.setattr(l2_ahead, "PARTIAL", False)
    whole_only = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True, sites=frozenset(l2_ahead.ALL_SITES))
    assert whole_only[0].qkv == l2_ahead.weight_tensors(o) and whole_only[0].gate_up == ()


def test_a_small_l2_takes_only_what_fits():
    # a 2 MB L2 (an RTX 3050's; it has no programmatic launches, so this is the rule alone): no
    # whole 3B weight, leading rows of at most 1 MB per site (the qkv's two sites: o and gate/up)
    small = l2_ahead.plan([layer(2048, 11008)] * 2, l2_bytes=2 * MB, enabled=True)
    assert all(0 < nbytes(a.gate_up) <= MB and nbytes(a.qkv) <= 2 * MB for a in small)
    assert 0 < nbytes(small[0].down) <= MB and small[1].down == ()


def test_nothing_is_prefetched_without_programmatic_launches_or_sites():
    layers = [layer(2048, 11008)] * 2
    assert l2_ahead.plan(layers, 50 * MB, enabled=False) == [l2_ahead.NONE] * 2
    assert l2_ahead.plan(layers, 50 * MB, enabled=True, sites=frozenset()) == [l2_ahead.NONE] * 2
    only = l2_ahead.plan(layers, 50 * MB, enabled=True, sites=frozenset({"gate_up>down"}))
    assert only[0].qkv == () and only[0].down == () and only[0].gate_up


def test_a_dense_weight_is_never_prefetched():
    dense = LinearWeight(16, 64, 64, dense=torch.empty(64, 64, dtype=torch.float16, device="meta"))
    assert l2_ahead.weight_tensors(dense) == ()


def test_the_decode_step_on_the_cpu_plans_no_prefetch():
    from app.engine.cuda.graphs import _l2_ahead_room
    from app.engine.cuda.ops import ReferenceOps

    assert _l2_ahead_room(ReferenceOps(), torch.device("cpu")) == (0, False)


# --- on the GPU -------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("gated", [False, True])
def test_prefetching_changes_no_output_bit(bits, gated):
    from tests.test_kernels_gpu import GATED, GEMV, activations, poisoned, weights

    op = (GATED if gated else GEMV)[bits][0]
    n, k = (2048, 1024) if gated else (1001, 1152)
    w = weights(bits, 2 * n if gated else n, k, seed=7)
    later = weights(3, 3584, 2048, seed=8) + weights(4, 512, 256, seed=9)  # five tensors, odd sizes
    unaligned = torch.empty(1000, dtype=torch.uint8, device="cuda")[3:]  # a span starting mid-line
    for m in (1, 5, 12):
        x = activations(m, k, seed=m)
        plain = op(x, *w, out=poisoned(m, n))
        asked = op(x, *w, out=poisoned(m, n), ahead=later + (unaligned,))
        assert torch.equal(plain, asked), m


@pytest.mark.gpu
def test_more_than_eight_spans_or_another_device_is_refused():
    from app.kernels import gemv_w4
    from app.kernels.loader import KernelArgumentError
    from tests.test_kernels_gpu import activations, weights

    w = weights(4, 256, 256, seed=1)
    with pytest.raises(KernelArgumentError, match="at most 8"):
        gemv_w4(activations(1, 256, seed=1), *w, ahead=w * 5)
    with pytest.raises(KernelArgumentError, match="ahead\\[0\\]"):
        gemv_w4(activations(1, 256, seed=1), *w, ahead=(torch.empty(4),))
