"""Launcher for the row-wise argmax (argmax.cu): the greedy token of every decode-step row,
in two programmatic launches (PyTorch's reduction sat exposed in the step's chain). Same
result as ``torch.argmax(logits, dim=-1)``, ties and NaNs included."""

from __future__ import annotations

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_tensor, ensure_output

ARGMAX_BLOCKS = 32  # argmax.cu: slices of a row
ARGMAX_THREADS = 256


def argmax_workspace(rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(values fp32 [rows, ARGMAX_BLOCKS], indices int32 [rows, ARGMAX_BLOCKS]): the slices' partials."""
    return (torch.empty((rows, ARGMAX_BLOCKS), dtype=torch.float32, device=device),
            torch.empty((rows, ARGMAX_BLOCKS), dtype=torch.int32, device=device))


def argmax_rows(logits: torch.Tensor, *, workspace: tuple[torch.Tensor, torch.Tensor],
                out: torch.Tensor | None = None) -> torch.Tensor:
    """logits fp16 [B, V] (contiguous) -> int64 [B] (into ``out``), graph-safe."""
    loader.require()
    check_tensor("logits", logits, torch.float16, (None, None), aligned=False)
    rows, vocab = logits.shape
    dev = logits.device
    part_v, part_i = workspace
    check_tensor("argmax values", part_v, torch.float32, (None, ARGMAX_BLOCKS), device=dev)
    check_tensor("argmax indices", part_i, torch.int32, (None, ARGMAX_BLOCKS), device=dev)
    if part_v.shape[0] < rows or part_i.shape[0] < rows:
        raise loader.KernelArgumentError(f"argmax workspace: {part_v.shape[0]} rows, the logits have {rows}")
    tokens = ensure_output("out", out, (rows,), torch.int64, dev)
    if rows == 0 or vocab == 0:
        return tokens
    part = loader.get_kernel("argmax.cu", "argmax_part_kernel")
    loader.launch(part, (ARGMAX_BLOCKS, rows), (ARGMAX_THREADS,),
                  (logits.data_ptr(), np.int32(vocab), part_v.data_ptr(), part_i.data_ptr()))
    final = loader.get_kernel("argmax.cu", "argmax_final_kernel")
    loader.launch(final, (rows,), (32,), (part_v.data_ptr(), part_i.data_ptr(), np.int32(ARGMAX_BLOCKS),
                                          tokens.data_ptr()))
    return tokens
