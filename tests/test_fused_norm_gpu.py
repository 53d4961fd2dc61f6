"""The RMSNorm fused into the qkv and gate/up GEMVs (gemv.cu NORM): bit-identical to the norm
kernel followed by the plain GEMV, so the decode step may take either path (the fused one at
small batches) without changing a single output bit; and right against the references.

GPU tests (the device machine): python3 -m pytest -m gpu tests/test_fused_norm_gpu.py
CPU test: the fits rule.
"""

from __future__ import annotations

import pytest
import torch

from app.engine.cuda.ops import KernelOps
from app.kernels import GemvConfig, fused_norm_fits, rms_norm
from app.kernels import reference as ref
from app.kernels.loader import KernelArgumentError
from tests.test_kernels_gpu import GATED, GEMV, REL_TOL, activations, poisoned, rel_err, weights

SHAPES = [  # (name, N (rows of W), K, gated): Qwen2.5 3B / 7B qkv and gate/up, K > 8192, odd ones
    ("3b_qkv", 2560, 2048, False), ("7b_qkv", 4608, 3584, False), ("3b_gate_up", 2 * 11008, 2048, True),
    ("7b_gate_up", 2 * 18944, 3584, True), ("k_9216", 1040, 9216, False), ("odd_77x384", 77, 384, False),
    ("odd_gated_48x1152", 2 * 48, 1152, True),
]
CONFIGS = [None, GemvConfig(tiles=1, warps=2, unroll=2), GemvConfig(tiles=2, warps=3), GemvConfig(tiles=1, warps=32)]


def residual_stream(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows like a real residual stream: mixed magnitudes, a few large outliers."""
    h = activations(m, k, seed) * 4
    h[:, ::97] *= 16
    return h


def unfused(op, h, w, norm_weight, eps, config):
    return op(rms_norm(h, norm_weight, eps), *w, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("name,n,k,gated", SHAPES, ids=[s[0] for s in SHAPES])
def test_fused_norm_is_bit_equal_to_norm_then_gemv(bits, name, n, k, gated):
    op, reference = (GATED if gated else GEMV)[bits]
    w = weights(bits, n, k, seed=41)
    norm_weight = (activations(1, k, seed=42)[0] * 0.5 + 1).half()
    n_out = n // 2 if gated else n
    for m in range(1, 9):
        if not fused_norm_fits(m, k, n_out, gated=gated, device=torch.device("cuda")):
            continue
        h = residual_stream(m, k, seed=43 + m)
        out = poisoned(m, n_out)
        op(h, *w, out=out, norm_weight=norm_weight, norm_eps=1e-6)
        assert torch.equal(out, unfused(op, h, w, norm_weight, 1e-6, None)), (name, m)
        assert rel_err(out, reference(ref.rms_norm_ref(h, norm_weight, 1e-6), *w)) < REL_TOL, (name, m)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("config", CONFIGS)
def test_fused_norm_bit_equal_in_every_config(bits, config):
    """Other block shapes (two tiles, one warp pair, 1,024 threads) normalize alike."""
    n, k = 1056, 2048
    for gated in (False, True):
        op = (GATED if gated else GEMV)[bits][0]
        w = weights(bits, n, k, seed=51)
        norm_weight = activations(1, k, seed=52)[0]
        if not fused_norm_fits(4, k, n // 2 if gated else n, gated=gated, device=torch.device("cuda"), config=config):
            continue
        h = residual_stream(4, k, seed=53)
        fused = op(h, *w, config=config, norm_weight=norm_weight, norm_eps=1e-5)
        assert torch.equal(fused, unfused(op, h, w, norm_weight, 1e-5, config)), (config, gated)


@pytest.mark.gpu
def test_fused_norm_refuses_rows_that_do_not_fit():
    k = 3584
    w = weights(4, 64, k, seed=61)
    with pytest.raises(KernelArgumentError, match="shared memory"):
        GEMV[4][0](activations(8, k, seed=62), *w, norm_weight=activations(1, k, seed=63)[0], norm_eps=1e-6)


def test_fused_norm_fits_counts_the_blocks_static_shared_memory():
    cpu = torch.device("cpu")
    gate_up_3b = GemvConfig(tiles=1, warps=8)  # the H200 default for the 3B gate/up
    assert fused_norm_fits(8, 2048, 11008, gated=True, device=cpu, config=gate_up_3b)  # 32 KB + 10 KB
    assert not fused_norm_fits(9, 2048, 11008, gated=True, device=cpu, config=gate_up_3b)  # a second column block
    assert fused_norm_fits(5, 3584, 4608, gated=False, device=cpu, config=GemvConfig(tiles=1, warps=16))
    assert not fused_norm_fits(6, 3584, 4608, gated=False, device=cpu, config=GemvConfig(tiles=1, warps=16))
    # 1,024 threads hold 16 KB of partial sums: 8 rows of 2048 no longer fit
    assert not fused_norm_fits(8, 2048, 2048, gated=False, device=cpu, config=GemvConfig(tiles=1, warps=32))


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["w4", "mixed"])
def test_decode_step_with_fused_norms_equals_the_unfused_step(recipe):
    """The whole graphed step (qkv and gate/up fused) against KernelOps(fuse_norm=False): the
    same logits, bit for bit, over 20 steps of 3 sequences."""
    from tests.test_cuda_runtime import gpu_runner, random_model, runtime_weights, tiny_spec

    weights = runtime_weights(random_model(tiny_spec(), seed=71), recipe)
    runners = [gpu_runner(weights, num_slots=4, max_context=128, prefill_mode="gemm", ops=KernelOps(fuse_norm=f))
               for f in (True, False)]
    for runner in runners:
        for slot in range(3):
            runner.prefill(slot, [5 + slot, 6, 7 + 2 * slot, 8], 0)
    tokens, pos = [1, 2, 3], [4, 4, 4]
    for _ in range(20):
        fused, plain = (r.decode([0, 1, 2], tokens, pos) for r in runners)
        assert torch.equal(fused, plain)
        tokens, pos = fused.argmax(-1).tolist(), [p + 1 for p in pos]
