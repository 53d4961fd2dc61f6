"""Launcher for the temperature draw (temperature_draw.cu): the sampled token of every decode-step
row that has a temperature and no top-k / top-p, drawn on the device in two programmatic
launches without a sort. Reference: :func:`app.kernels.reference.temperature_draw_ref`."""

from __future__ import annotations

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_tensor

DRAW_SLICES = 32  # temperature_draw.cu: slices of a row (grid.x)
DRAW_THREADS = 256
DRAW_PARAMS = 4  # rows of the parameters: temperature, top_p, top_k, u (app.engine.cuda.draw DRAW_INPUTS)


def temperature_draw_workspace(rows: int, device) -> torch.Tensor:
    """fp32 [2, rows, DRAW_SLICES]: each slice's largest scaled logit and its softmax sum."""
    return torch.empty((2, rows, DRAW_SLICES), dtype=torch.float32, device=device)


def temperature_draw(logits: torch.Tensor, vocab: int, params: torch.Tensor, *, workspace: torch.Tensor,
                     out: torch.Tensor) -> torch.Tensor:
    """``logits`` fp16 [B, ld] (contiguous), drawn over their first ``vocab`` columns; ``params``
    fp32 [4, >= B] (contiguous): per row temperature, top_p, top_k, u. Rows with a temperature
    and neither top-k nor top-p get their token in ``out`` int64 [B]; the other rows keep what
    ``out`` holds (the argmax). Graph-safe."""
    loader.require()
    check_tensor("logits", logits, torch.float16, (None, None), aligned=False)
    rows, ld = logits.shape
    dev = logits.device
    check_tensor("params", params, torch.float32, (DRAW_PARAMS, None), device=dev, aligned=False)
    check_tensor("workspace", workspace, torch.float32, (2, None, DRAW_SLICES), device=dev)
    check_tensor("out", out, torch.int64, (rows,), device=dev, aligned=False)
    if params.shape[1] < rows or workspace.shape[1] < rows:
        raise loader.KernelArgumentError(f"temperature draw: {rows} rows, params for {params.shape[1]}, "
                                         f"workspace for {workspace.shape[1]}")
    if not 0 < vocab <= ld:
        raise loader.KernelArgumentError(f"temperature draw: vocab {vocab} outside 1..{ld}")
    if rows == 0:
        return out
    part_m, part_z = workspace[0], workspace[1]
    common = (logits.data_ptr(), np.int32(ld), np.int32(vocab), params.data_ptr(), np.int32(params.shape[1]))
    part = loader.get_kernel("temperature_draw.cu", "temperature_part_kernel")
    loader.launch(part, (DRAW_SLICES, rows), (DRAW_THREADS,), common + (part_m.data_ptr(), part_z.data_ptr()))
    pick = loader.get_kernel("temperature_draw.cu", "temperature_pick_kernel")
    loader.launch(pick, (DRAW_SLICES, rows), (DRAW_THREADS,),
                  common + (part_m.data_ptr(), part_z.data_ptr(), out.data_ptr()))
    return out
