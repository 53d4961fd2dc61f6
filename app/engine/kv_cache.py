"""Static KV cache: allocated once at load for a fixed number of slots and a maximum context.

Layout ``[layers, slots, kv_heads, max_context, head_dim]`` (gpt-fast style: never resized,
only indexed). A request owns one slot for its lifetime; positions are absolute within it.
"""

from __future__ import annotations

import torch

from app.errors import ContextLengthError
from app.formats.spec import ModelSpec


class StaticKVCache:
    def __init__(self, spec: ModelSpec, num_slots: int, max_context: int, dtype: torch.dtype, device: torch.device | str,
                 zeroed: bool = True):
        """``zeroed=False``: left uninitialized, for a reader that reads only the positions
        written before (the reference model, through :meth:`append`). On the CPU the cache then
        takes memory page by page as requests reach further into it, instead of all at load
        (the tray's starter model: 4 slots of 4,096 tokens in fp32 are 755 MB)."""
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.num_slots = num_slots
        self.max_context = max_context
        shape = (spec.num_layers, num_slots, spec.num_kv_heads, max_context, spec.head_dim)
        allocate = torch.zeros if zeroed else torch.empty
        self.k = allocate(shape, dtype=dtype, device=device)
        self.v = allocate(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_needed(spec: ModelSpec, num_slots: int, max_context: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * spec.num_layers * num_slots * spec.num_kv_heads * max_context * spec.head_dim * elem

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def check_range(self, slot: int, start: int, length: int) -> None:
        """Positions past the cache are an error, never silent corruption."""
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"KV-cache slot {slot} out of range 0..{self.num_slots - 1}")
        if start < 0 or start + length > self.max_context:
            raise ContextLengthError(
                f"positions {start}..{start + length - 1} exceed the context of {self.max_context} tokens",
                limit=self.max_context, requested=start + length)

    def append(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [T, Hkv, D] at positions start..start+T-1; return all [Hkv, start+T, D]."""
        t = k.shape[0]
        self.check_range(slot, start, t)
        end = start + t
        self.k[layer, slot, :, start:end] = k.transpose(0, 1)
        self.v[layer, slot, :, start:end] = v.transpose(0, 1)
        return self.k[layer, slot, :, :end], self.v[layer, slot, :, :end]
