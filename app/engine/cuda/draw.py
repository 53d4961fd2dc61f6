"""Sampled tokens drawn on the device, after the decode graph has left the logits and their
argmax in its buffers, through the runner's ops: on the GPU app.kernels.token_draw (rows at a
temperature alone in two launches; top-k / top-p rows in ten, without a sort), on the CPU
their references (app.kernels.reference.temperature_draw_ref, and
app.engine.sampling.sample_rows for top-k / top-p: the host sampler's own arithmetic).

The runner keeps each sampling slot's settings (:class:`~app.engine.sampling.RowSampling`), so
a step chained on the device draws without the host; each row's uniform number comes from its
seed and the new token's position, uploaded with the step like the graph's inputs.
"""

from __future__ import annotations

import torch

from app.engine.sampling import RowSampling, uniform
from app.kernels.token_draw import draw_workspace

DRAW_INPUTS = ("temperature", "top_p", "top_k", "uniform")  # per row (the draw kernels' params)
ARGMAX_ROW = (0.0, 1.0, 0.0, 0.0)  # temperature 0: the row keeps its argmax


class DeviceDraw:
    def __init__(self, rows: int, device: torch.device, ops):
        """``rows``: the decode graph's rows; ``ops``: the runner's ops (``temperature_draw``,
        ``filtered_draw``)."""
        cuda = device.type == "cuda"
        self._ops = ops
        self._workspace = draw_workspace(rows, device)
        self._slots: dict[int, RowSampling] = {}  # the slots that sample, and how
        self._host = torch.empty((len(DRAW_INPUTS), rows), dtype=torch.float32, pin_memory=cuda)
        self._inputs = torch.empty((len(DRAW_INPUTS), rows), dtype=torch.float32, device=device)
        self._uploaded = torch.cuda.Event() if cuda else None  # the GPU has read _host

    def set(self, slot: int, row: RowSampling | None) -> None:
        """``slot``'s tokens from now on: drawn as ``row`` says, or the argmax (None, temperature 0)."""
        if row is None or row.temperature == 0:
            self._slots.pop(slot, None)
        else:
            self._slots[slot] = row

    def for_slots(self, slots: list[int]) -> list[RowSampling | None]:
        return [self._slots.get(slot) for slot in slots]

    def draw(self, rows: list[RowSampling | None], positions: list[int], logits: torch.Tensor,
             tokens: torch.Tensor) -> None:
        """Overwrite ``tokens[i]`` (the argmax of ``logits[i]``) with row i's draw where
        ``rows[i]`` samples, in stream order; ``positions[i] + 1`` is the new token's position."""
        drawn = [row for row in rows if row is not None and row.temperature > 0]
        if not drawn:
            return
        self._upload([ARGMAX_ROW if row is None or row.temperature == 0 else
                      (row.temperature, row.top_p, float(min(row.top_k, row.vocab)), uniform(row.seed, pos + 1))
                      for row, pos in zip(rows, positions)])
        vocab = min(drawn[0].vocab, logits.shape[-1])
        if any(not row.filtered for row in drawn):  # all of them in one go
            self._ops.temperature_draw(logits, vocab, self._inputs, workspace=self._workspace, out=tokens)
        if any(row.filtered for row in drawn):
            self._ops.filtered_draw(logits, vocab, self._inputs, workspace=self._workspace, out=tokens)

    def _upload(self, values: list[tuple[float, ...]]) -> None:
        """Rows of DRAW_INPUTS values -> the first n columns of ``_inputs`` (asynchronous)."""
        n = len(values)
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the previous upload has left the pinned buffer
        self._host[:, :n] = torch.tensor(values, dtype=torch.float32).t()
        self._inputs[:, :n].copy_(self._host[:, :n], non_blocking=True)
        if self._uploaded is not None:
            self._uploaded.record()
