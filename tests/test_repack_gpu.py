"""GPU tests of the load-time tile repack kernels (app/kernels/repack.cu) against the PyTorch
repack (app.kernels.w3_tiles / w4_tiles), which is their reference.

Integer moves only, so the bound is exact equality. Inputs are fresh random words (every
bit pattern is a valid weight); the kernels' scratch buffers are poisoned so a lane left
unwritten shows up; chunks are made small so a weight spans several, the last one partial.
Run on the device machine: python3 -m pytest -m gpu tests/test_repack_gpu.py
"""

from __future__ import annotations

import pytest
import torch

from app.kernels import repack
from app.kernels.loader import KernelArgumentError
from app.kernels.w3_tiles import repack_w3_tiles
from app.kernels.w4_tiles import repack_w4_tiles

pytestmark = pytest.mark.gpu
DEV = "cuda"
POISON = 0x7F7F7F7F

# (N, K): real Qwen2.5-3B / 7B projections and small odd ones (N a multiple of 16).
SHAPES = [(2560, 2048), (3584, 18944), (37888, 3584), (16, 128), (48, 384), (208, 1152)]


@pytest.fixture
def kernel() -> repack.TileRepackKernel:
    return repack.TileRepackKernel(torch.device(DEV))


@pytest.fixture
def poisoned_scratch(monkeypatch):
    def scratch(like, rows, cols):
        return torch.full((rows, cols), POISON, dtype=torch.int32, device=like.device)

    monkeypatch.setattr(repack, "_scratch", scratch)


def rand_words(*shape, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("n,k", SHAPES)
def test_w3_repack_equals_the_pytorch_repack(kernel, poisoned_scratch, n, k):
    qlow, qhigh = rand_words(n, k // 16, seed=n + k), rand_words(n, k // 32, seed=n + k + 1)
    want_a, want_b = repack_w3_tiles(qlow, qhigh)
    kernel.w3_(qlow, qhigh)
    assert torch.equal(qlow, want_a) and torch.equal(qhigh, want_b)


@pytest.mark.parametrize("n,k", SHAPES)
def test_w4_repack_equals_the_pytorch_repack(kernel, poisoned_scratch, n, k):
    qweight = rand_words(n, k // 8, seed=n + k)
    want = repack_w4_tiles(qweight)
    kernel.w4_(qweight)
    assert torch.equal(qweight, want)


@pytest.mark.parametrize("rows_per_chunk", [16, 48])
def test_a_weight_over_several_chunks_the_last_partial(kernel, poisoned_scratch, monkeypatch, rows_per_chunk):
    n, k = 16 * 7, 1024
    monkeypatch.setattr(repack, "CHUNK_ELEMENTS", rows_per_chunk * k)
    qlow, qhigh, qweight = rand_words(n, k // 16, seed=1), rand_words(n, k // 32, seed=2), rand_words(n, k // 8, seed=3)
    want_a, want_b = repack_w3_tiles(qlow, qhigh)
    want_w4 = repack_w4_tiles(qweight)
    kernel.w3_(qlow, qhigh)
    kernel.w4_(qweight)
    assert torch.equal(qlow, want_a) and torch.equal(qhigh, want_b) and torch.equal(qweight, want_w4)


def test_untileable_or_misplaced_weights_are_refused(kernel):
    with pytest.raises(KernelArgumentError, match="N % 16"):
        kernel.w4_(rand_words(24, 16, seed=1))
    with pytest.raises(KernelArgumentError, match="contiguous"):
        kernel.w4_(rand_words(32, 32, seed=1)[:, :16])
    with pytest.raises(KernelArgumentError, match="does not match"):
        kernel.w3_(rand_words(16, 8, seed=1), rand_words(16, 8, seed=2))
    with pytest.raises(KernelArgumentError, match="CUDA"):
        kernel.w4_(torch.zeros((16, 16), dtype=torch.int32))
