"""The one object that touches the model and the device.

``TorchRunner`` is the reference (CPU) backend: each sequence segment runs through the
plain-PyTorch model on its own, so a request's arithmetic never depends on what else is in
the batch (greedy output is batch-invariant). A CUDA backend implements the same two calls
with batched kernels and CUDA graphs.
"""

from __future__ import annotations

from typing import Protocol

import torch

from app.engine.kv_cache import StaticKVCache
from app.engine.models.decoder import DecoderModel
from app.engine.quantized.modules import quantized_nbytes


class Runner(Protocol):
    max_context: int
    num_slots: int

    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Run ``ids`` at positions start.. in ``slot``; logits [V] of the last one."""

    def decode(self, slots: list[int], ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token for each of several sequences; logits [B, V]."""

    def memory_info(self) -> dict:
        """Bytes used by weights, KV cache and workspace."""


class TorchRunner:
    def __init__(self, model: DecoderModel, cache: StaticKVCache, device: torch.device):
        self.model = model
        self.cache = cache
        self.device = device
        self.max_context = cache.max_context
        self.num_slots = cache.num_slots

    @torch.inference_mode()
    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self.model(tokens, start, slot, self.cache)

    @torch.inference_mode()
    def decode(self, slots: list[int], ids: list[int], positions: list[int]) -> torch.Tensor:
        rows = [self.prefill(slot, [tok], pos) for slot, tok, pos in zip(slots, ids, positions)]
        return torch.stack(rows)

    @torch.inference_mode()
    def all_logits(self, slot: int, ids: list[int], start: int = 0) -> torch.Tensor:
        """Logits for every position of ``ids`` [T, V] (perplexity, parity tests)."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self.model(tokens, start, slot, self.cache, all_logits=True)

    def memory_info(self) -> dict:
        # packed weights are buffers, not parameters
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters()) + quantized_nbytes(self.model)
        return {"weights_bytes": weights, "kv_cache_bytes": self.cache.nbytes, "device": str(self.device)}
