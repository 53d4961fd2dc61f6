"""The RMSNorm fused into the GEMVs at batch 1 (docs/KERNELS.md § Fused norms): the chunk order of
the sum of squares (CPU), the norm kernel and the GEMVs bit-equal to it (GPU), and a decode
step with and without the fusion (CPU wiring, GPU bits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine.cuda.step_norms import SITES
from app.kernels import reference as ref

# -- the order (CPU) -----------------------------------------------------------------------------


def chunk_sums_by_definition(row: np.ndarray) -> list[np.float32]:
    """common.cu's definition, one float32 operation at a time."""
    f32 = np.float32
    sums = []
    for c in range(len(row) // 16):
        x = [f32(v) for v in row[16 * c:16 * c + 16]]
        p = [f32(x[e] * x[e]) + f32(x[e + 8] * x[e + 8]) for e in range(8)]
        sums.append(f32(f32(p[0] + p[1]) + f32(p[2] + p[3])) + f32(f32(p[4] + p[5]) + f32(p[6] + p[7])))
    return sums


def test_chunk_sums_reference_follows_the_definition():
    h = (torch.randn(2, 576, generator=torch.Generator().manual_seed(1)) * 5).half()
    got = ref.norm_chunk_sums_ref(h)
    for m in range(2):
        want = chunk_sums_by_definition(h[m].float().numpy())
        assert got[m].numpy().tobytes() == np.array(want, dtype=np.float32).tobytes()


def test_chunk_ordered_norm_is_hf_rmsnorm_within_an_ulp():
    g = torch.Generator().manual_seed(2)
    for hidden in (256, 2048, 3584):
        h, w = (torch.randn(3, hidden, generator=g) * 4).half(), (1 + 0.2 * torch.randn(hidden, generator=g)).half()
        got, want = ref.rms_norm_chunked_ref(h, w, 1e-6).float(), ref.rms_norm_ref(h, w, 1e-6).float()
        assert ((got - want).abs() <= 1e-3 * want.abs() + 1e-5).all()
        assert torch.allclose(ref.norm_inv_ref(ref.norm_chunk_sums_ref(h), hidden, 1e-6),
                              torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6), rtol=1e-5)


def test_fusion_applies_to_batch_one_staged_rows_only():
    from app.kernels.gemv import fuses_norm

    assert fuses_norm(1, 2048) and fuses_norm(1, 576) and fuses_norm(1, 3584)  # the 7B's 7 KB: staged for it
    assert not fuses_norm(2, 2048)  # batch 2: the norm kernel (same bits)
    assert not fuses_norm(1, 8192)  # too large to stage
    assert not fuses_norm(1, 200)  # not whole chunks of 16


def decode_logits(fused: bool, device: str, steps: int = 6) -> list[torch.Tensor]:
    """Batch-1 greedy decode of a tiny quantized model with the fusion on or off."""
    from test_cuda_runtime import random_model, runtime_weights, tiny_spec

    from app.engine.cuda.runner import CudaRunner
    from app.engine.runner import RunnerOptions

    weights = runtime_weights(random_model(tiny_spec(), seed=11), "mixed").map_tensors(lambda t: t.to(device))
    runner = CudaRunner(weights, num_slots=2, max_context=64, prefill_mode="gemm",
                        options=RunnerOptions(fuse_norms=fused))
    # W4/W3 everywhere, hidden 256: every site is fused at batch 1 (a tiny model's prologues are small)
    assert runner.step.fused_norm_sites(1) == (frozenset(SITES) if fused else frozenset())
    assert runner.step.fused_norm_sites(2) == frozenset()
    token, out = int(runner.prefill(0, [3, 14, 15, 92], 0).argmax()), []
    for pos in range(4, 4 + steps):
        logits = runner.decode([0], [token], [pos])
        out.append(logits.cpu())
        token = int(logits[0].argmax())
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_decode_step_with_fused_norms_equals_the_norm_kernels(device):
    """The same logits with the norms fused or not: on the CPU this checks the wiring (which
    norm weight and which sums feed which linear), on the GPU the bits of a graphed step."""
    fused = decode_logits(True, device)
    unfused = decode_logits(False, device)
    assert all(torch.equal(a, b) for a, b in zip(fused, unfused))


@pytest.mark.gpu
def test_the_step_fuses_where_the_prologues_read_little():
    """On the real shapes (H200 grid): the 3B fuses the qkv and gate/up norms, not the head's
    (9,496 blocks would each read x, the weight and the sums); the 7B only the qkv's."""
    from app.engine.cuda.ops import KernelOps
    from app.engine.cuda.weights import LinearWeight
    from app.kernels import gemv, loader

    def linear(n, k):  # shapes only: the rule never reads the values
        return LinearWeight(4, n, k, qa=torch.empty(n, k // 8, dtype=torch.int32, device="cuda"),
                            scales=torch.empty(n, k // 128, dtype=torch.float16, device="cuda"))

    ops, sms = KernelOps(), loader.sm_count(torch.device("cuda", 0))  # the planned count (conftest)
    assert ops.fuses_norm(1, linear(2560, 2048), False) and not ops.fuses_norm(2, linear(2560, 2048), False)
    assert ops.fuses_norm(1, linear(4608, 3584), False)
    heads = [linear(151936, 2048), linear(152064, 3584)]
    assert not any(ops.fuses_norm(1, w, False) for w in heads)
    if sms >= 100:  # the H200's grids (on a small GPU the gate/up's blocks hold more rows each)
        assert ops.fuses_norm(1, linear(2 * 11008, 2048), True)
        assert not ops.fuses_norm(1, linear(2 * 18944, 3584), True)
    assert gemv.norm_prologue_bytes(2560, 2048, False, torch.device("cuda")) <= gemv.NORM_PROLOGUE_BYTES


# -- the kernels (GPU) ---------------------------------------------------------------------------

def gpu_helpers():
    from test_kernels_gpu import GATED, GEMV, activations, poisoned, weights

    return GEMV, GATED, activations, poisoned, weights


@pytest.mark.gpu
@pytest.mark.parametrize("rows,hidden", [(1, 2048), (5, 3584), (8, 896), (2, 576), (1, 16384), (3, 16)])
def test_norm_kernel_is_bit_equal_to_the_chunk_ordered_reference(rows, hidden):
    from app.kernels import rms_norm

    _, _, activations, poisoned, _ = gpu_helpers()
    x, w = activations(rows, hidden, seed=41) * 3, activations(1, hidden, seed=42)[0]
    out = rms_norm(x, w, 1e-6, out=poisoned(rows, hidden))
    assert torch.equal(out, ref.rms_norm_chunked_ref(x, w, 1e-6))
    residual = activations(rows, hidden, seed=43) * 5
    y, h = rms_norm(x, w, 1e-6, residual=residual.clone(), out=poisoned(rows, hidden))
    assert torch.equal(y, ref.rms_norm_chunked_ref(h, w, 1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("n,k", [(2048, 2048), (2048, 11008), (576, 1536), (3584, 18944), (64, 256)])
@pytest.mark.parametrize("m", [1, 3, 11])
def test_residual_gemv_writes_the_chunk_sums_of_its_output(bits, n, k, m):
    GEMV, _, activations, poisoned, weights = gpu_helpers()
    op = GEMV[bits][0]
    w, x = weights(bits, n, k, seed=51), activations(m, k, seed=52)
    h = activations(m, n, seed=53) * 4
    sums = poisoned(m, n // 16, dtype=torch.float32)
    want_h = op(x, *w, residual=h.clone(), out=poisoned(m, n))
    op(x, *w, residual=h, out=h, sums_out=sums)  # in place, as the decode step runs it
    assert torch.equal(h, want_h)
    assert torch.equal(sums, ref.norm_chunk_sums_ref(h))


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
@pytest.mark.parametrize("gated,n,k,bias", [(False, 2560, 2048, True), (True, 2 * 11008, 2048, False),
                                            (False, 151936, 2048, False), (True, 2 * 96, 1152, False),
                                            (False, 77, 384, True), (False, 4608, 3584, True),
                                            (True, 2 * 18944, 3584, False), (False, 152064, 3584, False)])
def test_fused_norm_is_bit_equal_to_the_norm_kernel_then_the_gemv(bits, gated, n, k, bias):
    """The 3B and 7B qkv (bias), gate/up and lm_head, and odd shapes."""
    from app.kernels import rms_norm
    from app.kernels.gemv import FusedNorm

    GEMV, GATED, activations, poisoned, weights = gpu_helpers()
    op = (GATED if gated else GEMV)[bits][0]
    w, n_out = weights(bits, n, k, seed=61), n // 2 if gated else n
    extra = {"bias": activations(1, n, seed=62)[0]} if bias else {}
    h, norm_w = activations(1, k, seed=63) * 6, activations(1, k, seed=64)[0]
    unfused = op(rms_norm(h, norm_w, 1e-6, out=poisoned(1, k)), *w, out=poisoned(1, n_out), **extra)
    norm = FusedNorm(norm_w, ref.norm_chunk_sums_ref(h), 1e-6)
    fused = op(h, *w, out=poisoned(1, n_out), norm=norm, **extra)
    assert torch.isfinite(fused).all() and torch.equal(fused, unfused)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
def test_producer_and_fused_consumer_chain(bits):
    """down (residual, sums) -> gate/up with the fused norm, as in the step, against the norm kernel."""
    from app.kernels import rms_norm
    from app.kernels.gemv import FusedNorm

    GEMV, GATED, activations, poisoned, weights = gpu_helpers()
    down, up = weights(bits, 2048, 11008, seed=71), weights(bits, 2 * 11008, 2048, seed=72)
    act, h = activations(1, 11008, seed=73), activations(1, 2048, seed=74) * 3
    norm_w, sums = activations(1, 2048, seed=75)[0], poisoned(1, 128, dtype=torch.float32)
    GEMV[bits][0](act, *down, residual=h, out=h, sums_out=sums)
    fused = GATED[bits][0](h, *up, out=poisoned(1, 11008), norm=FusedNorm(norm_w, sums, 1e-6))
    unfused = GATED[bits][0](rms_norm(h, norm_w, 1e-6, out=poisoned(1, 2048)), *up, out=poisoned(1, 11008))
    assert torch.equal(fused, unfused)


@pytest.mark.gpu
def test_fused_norm_and_sums_refuse_what_they_do_not_cover():
    from app.kernels import KernelArgumentError
    from app.kernels.gemv import FusedNorm

    GEMV, GATED, activations, poisoned, weights = gpu_helpers()
    w, norm_w = weights(4, 64, 256, seed=91), activations(1, 256, seed=92)[0]
    sums = torch.zeros(2, 16, device="cuda")
    with pytest.raises(KernelArgumentError, match="batch 1"):
        GEMV[4][0](activations(2, 256, seed=93), *w, norm=FusedNorm(norm_w, sums, 1e-6))
    with pytest.raises(KernelArgumentError, match="gated kernel writes no chunk sums"):
        from app.kernels.gemv import _check_w4, _run

        _run(_check_w4(*weights(4, 64, 256, seed=94)), activations(1, 256, seed=95), gated=True, bias=None,
             residual=None, out=None, config=None, sums_out=torch.zeros(1, 2, device="cuda"))
