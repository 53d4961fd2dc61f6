"""The decode step's argmax (app.kernels.argmax, argmax.cu): torch.argmax's result, ties and NaNs
included. On the CPU the kernel's two-stage order in Python; on a GPU the kernel itself."""

from __future__ import annotations

import math

import pytest
import torch

from app.kernels.argmax import ARGMAX_BLOCKS


def two_stage_argmax(row: torch.Tensor, blocks: int = ARGMAX_BLOCKS) -> int:
    """argmax.cu's order: the row cut into ``blocks`` slices, each reduced to its (value, index),
    then the slices; a pair wins when larger, a NaN beats any number, ties go to the smaller index."""
    def before(a, ia, b, ib):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and (not math.isnan(b) or ia < ib)
        return a > b or (a == b and ia < ib)

    vocab = row.shape[0]
    slice_len = -(-vocab // blocks)
    best, at = -math.inf, 1 << 31
    for s in range(blocks):
        v, i = -math.inf, vocab
        for k in range(s * slice_len, min(vocab, (s + 1) * slice_len)):
            if before(float(row[k]), k, v, i):
                v, i = float(row[k]), k
        if before(v, i, best, at):
            best, at = v, i
    return at


def hard_rows(vocab: int) -> torch.Tensor:
    """Rows that test the order: random, a tie across slices, all equal, NaNs, all -inf."""
    g = torch.Generator().manual_seed(vocab)
    rows = torch.randn(6, vocab, generator=g).half()
    rows[1, [vocab // 3, vocab - 1, 5 % vocab]] = 30.0  # the same maximum in three slices
    rows[2] = 1.5
    rows[3, [vocab - 2, vocab // 2]] = float("nan")
    rows[4] = float("-inf")
    rows[5, vocab - 1] = 65504.0  # the largest fp16, in the last slice
    return rows


@pytest.mark.parametrize("vocab", [7, 33, 1000, 4099])
def test_the_two_stage_order_is_torch_argmax(vocab):
    rows = hard_rows(vocab)
    assert [two_stage_argmax(r) for r in rows] == torch.argmax(rows, dim=-1).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [7, 1000, 49152, 151936, 152064])
def test_argmax_kernel_equals_torch_argmax(vocab):
    from app.kernels import argmax_rows, argmax_workspace

    rows = hard_rows(vocab).cuda()
    rows = torch.cat([rows, torch.randn(10, vocab, device="cuda").half()])  # 16 rows, the decode graph's most
    out = torch.full((16,), -7, dtype=torch.int64, device="cuda")
    argmax_rows(rows, workspace=argmax_workspace(16, "cuda"), out=out)
    assert torch.equal(out, torch.argmax(rows, dim=-1))
    one = argmax_rows(rows[:1], workspace=argmax_workspace(1, "cuda"))  # a batch-1 row alone
    assert one.item() == out[0].item()
