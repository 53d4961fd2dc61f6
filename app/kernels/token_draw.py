"""Launchers for the device draw: the sampled tokens of a decode step's rows without a sort.

- :func:`temperature_draw` (temperature_draw.cu): rows at a temperature alone, two programmatic
  launches.
- :func:`filtered_draw` (filtered_draw.cu): rows with top-k and / or top-p, ten launches (the
  row's softmax, four launches narrowing top-k's key, four top-p's, the draw).

Both files share draw_common.cu (the loader puts it before them).

The reference is :func:`app.kernels.reference.temperature_draw_ref` and, with top-k / top-p,
app.engine.sampling.sample_rows (the host sampler's arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_tensor

DRAW_SLICES = 32  # draw_common.cu: slices of a row (grid.x)
DRAW_THREADS = 256
DRAW_PARAMS = 4  # rows of the parameters: temperature, top_p, top_k, u (app.engine.cuda.draw DRAW_INPUTS)
SEARCH_THRESHOLDS = 17  # filtered_draw.cu: G at lo + c << shift, c = 0..16
SEARCH_LAUNCHES = 8  # four narrowing top-k's key, four top-p's
STATE_FIELDS = 4


@dataclass(frozen=True, eq=False)
class DrawWorkspace:
    softmax: torch.Tensor  # fp32 [2, rows, DRAW_SLICES]: each slice's largest scaled logit and its sum
    counts: torch.Tensor  # int32 [2, rows, DRAW_SLICES, SEARCH_THRESHOLDS]: the searches' partials
    masses: torch.Tensor  # fp32 [2, rows, DRAW_SLICES, SEARCH_THRESHOLDS]
    state: torch.Tensor  # fp32 [SEARCH_LAUNCHES, rows, STATE_FIELDS]: each search launch's range

    @property
    def rows(self) -> int:
        return self.softmax.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.softmax, self.counts, self.masses, self.state))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.softmax, self.counts, self.masses, self.state


def draw_workspace(rows: int, device) -> DrawWorkspace:
    return DrawWorkspace(
        torch.empty((2, rows, DRAW_SLICES), dtype=torch.float32, device=device),
        torch.empty((2, rows, DRAW_SLICES, SEARCH_THRESHOLDS), dtype=torch.int32, device=device),
        torch.empty((2, rows, DRAW_SLICES, SEARCH_THRESHOLDS), dtype=torch.float32, device=device),
        torch.empty((SEARCH_LAUNCHES, rows, STATE_FIELDS), dtype=torch.float32, device=device))


def draw_workspace_bytes(rows: int) -> int:
    per_row = 2 * DRAW_SLICES * 4 + 2 * 2 * DRAW_SLICES * SEARCH_THRESHOLDS * 4 + SEARCH_LAUNCHES * STATE_FIELDS * 4
    return rows * per_row


def _checked(logits: torch.Tensor, vocab: int, params: torch.Tensor, workspace: DrawWorkspace,
             out: torch.Tensor) -> tuple:
    """The arguments every draw kernel starts with, after the boundary checks."""
    loader.require()
    check_tensor("logits", logits, torch.float16, (None, None), aligned=False)
    rows, ld = logits.shape
    dev = logits.device
    check_tensor("params", params, torch.float32, (DRAW_PARAMS, None), device=dev, aligned=False)
    check_tensor("out", out, torch.int64, (rows,), device=dev, aligned=False)
    if not isinstance(workspace, DrawWorkspace):
        raise loader.KernelArgumentError("draw workspace: expected a DrawWorkspace (draw_workspace())")
    for name, t in zip(("softmax", "counts", "masses", "state"), workspace.tensors()):
        check_tensor(f"workspace {name}", t, t.dtype, tuple(t.shape), device=dev)
    if params.shape[1] < rows or workspace.rows < rows:
        raise loader.KernelArgumentError(f"draw: {rows} rows, params for {params.shape[1]}, "
                                         f"workspace for {workspace.rows}")
    if not 0 < vocab <= ld:
        raise loader.KernelArgumentError(f"draw: vocab {vocab} outside 1..{ld}")
    return logits.data_ptr(), np.int32(ld), np.int32(vocab), params.data_ptr(), np.int32(params.shape[1])


def _softmax_parts(filtered: bool, common: tuple, rows: int, workspace: DrawWorkspace) -> tuple[int, int]:
    part_m, part_z = workspace.softmax[0, :rows], workspace.softmax[1, :rows]
    source = "filtered_draw.cu" if filtered else "temperature_draw.cu"
    kernel = loader.get_kernel(source, f"temperature_part_kernel<{str(filtered).lower()}>")
    loader.launch(kernel, (DRAW_SLICES, rows), (DRAW_THREADS,), common + (part_m.data_ptr(), part_z.data_ptr()))
    return part_m.data_ptr(), part_z.data_ptr()


def temperature_draw(logits: torch.Tensor, vocab: int, params: torch.Tensor, *, workspace: DrawWorkspace,
                     out: torch.Tensor) -> torch.Tensor:
    """``logits`` fp16 [B, ld] (contiguous), drawn over their first ``vocab`` columns; ``params``
    fp32 [4, >= B] (contiguous): per row temperature, top_p, top_k, u. Rows with a temperature
    and neither top-k nor top-p get their token in ``out`` int64 [B]; the other rows keep what
    ``out`` holds (the argmax). Graph-safe."""
    common = _checked(logits, vocab, params, workspace, out)
    rows = logits.shape[0]
    if rows == 0:
        return out
    parts = _softmax_parts(False, common, rows, workspace)
    pick = loader.get_kernel("temperature_draw.cu", "temperature_pick_kernel")
    loader.launch(pick, (DRAW_SLICES, rows), (DRAW_THREADS,), common + parts + (out.data_ptr(),))
    return out


def filtered_draw(logits: torch.Tensor, vocab: int, params: torch.Tensor, *, workspace: DrawWorkspace,
                  out: torch.Tensor) -> torch.Tensor:
    """Like :func:`temperature_draw` for the rows with a temperature and top-k and / or top-p
    (the others keep ``out``): top-k keeps the k largest logits and their ties, top-p then the
    most likely until their mass reaches it (ties in index order), as
    app.engine.sampling.probabilities does after its stable sort. Graph-safe."""
    common = _checked(logits, vocab, params, workspace, out)
    rows = logits.shape[0]
    if rows == 0:
        return out
    parts = _softmax_parts(True, common, rows, workspace)
    ws = (workspace.counts.data_ptr(), workspace.masses.data_ptr(), workspace.state.data_ptr(),
          np.int32(workspace.rows))
    search = loader.get_kernel("filtered_draw.cu", "filtered_search_kernel")
    for launch in range(SEARCH_LAUNCHES):
        loader.launch(search, (DRAW_SLICES, rows), (DRAW_THREADS,), common + parts + ws + (np.int32(launch),))
    pick = loader.get_kernel("filtered_draw.cu", "filtered_pick_kernel")
    loader.launch(pick, (DRAW_SLICES, rows), (DRAW_THREADS,), common + parts + ws + (out.data_ptr(),))
    return out

