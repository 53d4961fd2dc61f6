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


def test_by_default_a_preloading_gate_up_asks_for_its_down_projection():
    layers = [layer(2048, 11008) for _ in range(3)]  # the 3B's shapes: gate/up 22 MB, down 11 MB
    plan = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True)
    assert [a.gate_up for a in plan] == [l2_ahead.weight_tensors(lw.down) for lw in layers]
    assert all(a.qkv == () and a.down == () for a in plan)
    assert nbytes(plan[0].gate_up) == 2048 * 11008 // 2 + 2048 * 86 * 2  # tiles + scales
    # a gate/up that streams its weights to its end (no preload) asks for nothing
    streaming = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True, preloads=lambda w: False)
    assert streaming == [l2_ahead.NONE] * 3


def test_each_gemv_asks_for_the_weights_the_sites_name():
    layers = [layer(2048, 11008) for _ in range(3)]
    plan = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True, sites=frozenset(l2_ahead.ALL_SITES))
    for i, ahead in enumerate(plan):
        assert ahead.qkv == l2_ahead.weight_tensors(layers[i].o) + l2_ahead.weight_tensors(layers[i].gate_up)
        assert ahead.gate_up == l2_ahead.weight_tensors(layers[i].down)
        # the last layer's down has no next qkv (the head is far too big for L2)
        assert ahead.down == (l2_ahead.weight_tensors(layers[i + 1].qkv) if i < 2 else ())


def test_a_weight_larger_than_the_l2_share_is_not_prefetched():
    # the 7B `mixed` shapes: gate/up (W3) 51 MB, down 26.5 MB
    layers = [layer(3584, 18944, gate_up_bits=3) for _ in range(2)]
    plan = l2_ahead.plan(layers, l2_bytes=50 * MB, enabled=True, sites=frozenset(l2_ahead.ALL_SITES))
    assert plan[0].qkv == l2_ahead.weight_tensors(layers[0].o)  # o (6.4 MB), not the gate/up
    assert plan[0].gate_up == ()
    assert len(l2_ahead.weight_tensors(layers[0].gate_up)) == 3  # W3: a, b, scales
    larger_l2 = l2_ahead.plan(layers, l2_bytes=60 * MB, enabled=True)  # an H200's 60 MiB: 30 MiB each
    assert larger_l2[0].gate_up == l2_ahead.weight_tensors(layers[0].down)
    # a 2 MB L2 (an RTX 3050's, which has no programmatic launches either) holds no 3B weight
    small = l2_ahead.plan([layer(2048, 11008)] * 2, l2_bytes=2 * MB, enabled=True,
                         sites=frozenset(l2_ahead.ALL_SITES))
    assert small == [l2_ahead.NONE] * 2


def test_nothing_is_prefetched_without_programmatic_launches_or_sites():
    layers = [layer(2048, 11008)] * 2
    assert l2_ahead.plan(layers, 50 * MB, enabled=False) == [l2_ahead.NONE] * 2
    assert l2_ahead.plan(layers, 50 * MB, enabled=True, sites=frozenset()) == [l2_ahead.NONE] * 2


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
def test_more_than_six_spans_or_another_device_is_refused():
    from app.kernels import gemv_w4
    from app.kernels.loader import KernelArgumentError
    from tests.test_kernels_gpu import activations, weights

    w = weights(4, 256, 256, seed=1)
    with pytest.raises(KernelArgumentError, match="at most 6"):
        gemv_w4(activations(1, 256, seed=1), *w, ahead=w * 4)
    with pytest.raises(KernelArgumentError, match="ahead\\[0\\]"):
        gemv_w4(activations(1, 256, seed=1), *w, ahead=(torch.empty(4),))
