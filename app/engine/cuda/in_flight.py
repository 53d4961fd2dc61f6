"""Decode steps in flight: where each step's token ids land on the host, and in what order.

The decode step takes its tokens on the device (the graph's argmax, or a draw:
app.engine.sampling.sample_rows); a step only has to bring its B ids back.
:class:`TokensInFlight` keeps up to two launched steps (slots, positions), each with its own
pinned host buffer and CUDA event, so the step after a step can be launched before that
step's ids have reached the host (its ids come from the device,
``CudaRunner.decode_tokens_launch_next``): the GPU then never waits for the host between tokens.
"""

from __future__ import annotations

import torch

MAX_IN_FLIGHT = 2


class TokensInFlight:
    def __init__(self, rows: int, device: torch.device):
        cuda = device.type == "cuda"
        self._host = torch.empty((MAX_IN_FLIGHT, rows), dtype=torch.int64, pin_memory=cuda)
        self._ready = [torch.cuda.Event() if cuda else None for _ in range(MAX_IN_FLIGHT)]
        self._steps: list[tuple[list[int], list[int], int]] = []  # (slots, positions, buffer), oldest first

    def __len__(self) -> int:
        return len(self._steps)

    def keys(self) -> list[tuple[list[int], list[int]]]:
        """(slots, positions) of each step in flight, oldest first."""
        return [(list(slots), list(positions)) for slots, positions, _ in self._steps]

    def newest(self) -> tuple[list[int], list[int]]:
        slots, positions, _ = self._steps[-1]
        return list(slots), list(positions)

    def record(self, tokens: torch.Tensor, slots: list[int], positions: list[int]) -> None:
        """Queue the copy of ``tokens[:B]`` (the step just launched) to the host."""
        if len(self._steps) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"at most {MAX_IN_FLIGHT} decode steps can be in flight")
        buf = 1 - self._steps[0][2] if self._steps else 0
        n = len(slots)
        self._host[buf, :n].copy_(tokens[:n], non_blocking=True)
        if self._ready[buf] is not None:
            self._ready[buf].record()
        self._steps.append((list(slots), list(positions), buf))

    def collect(self) -> dict[tuple[int, int], int]:
        """{(slot, position): next token} of the oldest step ({} when none is in flight)."""
        if not self._steps:
            return {}
        slots, positions, buf = self._steps.pop(0)
        if self._ready[buf] is not None:
            self._ready[buf].synchronize()
        return dict(zip(zip(slots, positions), self._host[buf, : len(slots)].tolist()))

    def drop(self) -> None:
        """Wait for every step in flight and forget its ids."""
        while self._steps:
            self.collect()
