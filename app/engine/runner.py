"""The one object that touches the model and the device: the Runner protocol.

Every runner does ``prefill`` and ``decode`` (logits to the host). What a runner does beyond
that is declared in its :class:`RunnerCapabilities`, decided when it is built: the scheduler
reads them once and calls only what they grant. A runner without an ability still has its
methods; they raise :class:`NotImplementedError` naming the capability it declines.

``TorchRunner`` is the reference (CPU) backend: each sequence segment runs through the
plain-PyTorch model on its own, so a request's arithmetic never depends on what else is in
the batch (greedy output is batch-invariant). It declines every optional ability; its prefill
chunk is sized to the model, so one chunk takes a fraction of a second on a slow CPU. The CUDA
backend (app.engine.cuda.runner.CudaRunner) implements them with batched kernels and CUDA
graphs, set up by :class:`RunnerOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from app.engine.kv_cache import StaticKVCache
from app.engine.loading import layer_param_count
from app.engine.models.decoder import DecoderModel
from app.engine.quantized.modules import quantized_nbytes
from app.engine.sampling import RowSampling
from app.formats.spec import ModelSpec
from app.kernels.gemv import NORM_PROLOGUE_BYTES, GemvOptions

# Tokens of one prompt per prefill step at most, on a GPU: bounds the activation memory and how
# long the other requests' decode waits for the chunk.
GPU_PREFILL_CHUNK = 512
# On a CPU a chunk is sized by its work instead: about this many FLOPs of matmul (2 per weight
# per token), ~0.2-0.3 s on a slow laptop core pair (50-80 GFLOP/s). The starter model
# (SmolLM2-135M) gets 64 tokens, a 0.5B model or larger the floor of 16.
CPU_PREFILL_CHUNK_FLOPS = 16e9
CPU_PREFILL_CHUNK_RANGE = (16, 512)


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner does beyond prefill / decode (the scheduler uses nothing else).

    ``pipelined_decode``: a decode step's tokens are taken on the device and only the ids come
    back (``set_sampling``, ``decode_tokens``), and steps can be launched ahead of the host
    (``decode_tokens_launch`` / ``_launch_next`` / ``_collect`` / ``_in_flight``). Greedy rows
    always; sampled rows (without penalties) too where ``draw_on_device``.
    ``max_verify_rows``: tokens of one sequence one step can check (``tokens_rows`` /
    ``logits_rows``: guessed tokens, app.engine.lookup); 1 means none are guessed.
    ``prefill_chunk``: tokens of one prompt the scheduler hands to ``prefill`` per step at
    most (and a step's prefill tokens in all, unless one chunk is larger): a long prompt takes
    several steps, with other requests' chunks and decode steps between them. A prompt is cut
    at the same positions whatever else runs, so its arithmetic is the same as alone.
    """

    pipelined_decode: bool = False
    draw_on_device: bool = False
    max_verify_rows: int = 1
    prefill_chunk: int = GPU_PREFILL_CHUNK

    def __post_init__(self) -> None:
        if self.max_verify_rows < 1:
            raise ValueError(f"max_verify_rows must be >= 1, got {self.max_verify_rows}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.draw_on_device and not self.pipelined_decode:
            raise ValueError("draw_on_device needs pipelined_decode (the draw runs in the decode_tokens steps)")


@dataclass(frozen=True)
class RunnerOptions:
    """How the CUDA runner builds its decode step. Every switch gives bit-equal tokens either
    way; the defaults are the product's, and benchmarks turn one off to see what it gives
    (lab/ablate_step.py, python -m benchmarks.bench_device_sampling)."""

    fuse_norms: bool = True  # batch-1 RMSNorms inside the GEMV after them, where it pays (cuda/step_norms.py)
    # ... where the fused prologues read at most this much in all (x, norm weight, chunk sums per block)
    norm_prologue_bytes: int = NORM_PROLOGUE_BYTES
    fuse_rope: bool = True  # RoPE + KV write inside the attention's split kernel (one launch fewer)
    draw_on_device: bool = True  # sampled tokens drawn after the step on the device; False: logits to the host
    gemv: GemvOptions = field(default_factory=GemvOptions)  # x staged in shared memory, weight preload


class Runner(Protocol):
    device: torch.device
    max_context: int
    num_slots: int
    capabilities: RunnerCapabilities

    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Run ``ids`` at positions start.. in ``slot``; logits [V] of the last one."""

    def decode(self, slots: list[int], ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token for each of several sequences; logits [B, V]."""

    def memory_info(self) -> dict:
        """Bytes used by weights, KV cache and workspace."""

    def close(self) -> None:
        """Free what the runner holds beyond Python references (graphs, the allocator's cap)."""

    # -- capabilities.pipelined_decode ----------------------------------------------------------
    def set_sampling(self, slot: int, row: RowSampling | None) -> None:
        """How the decode_tokens steps take ``slot``'s token: drawn as ``row`` says, or the argmax."""

    def decode_tokens(self, slots: list[int], ids: list[int], positions: list[int]) -> list[int]:
        """One token per sequence, taken on the device; steps in flight are dropped first."""

    def decode_tokens_launch(self, slots: list[int], ids: list[int], positions: list[int]) -> None:
        """Start a step without waiting for it (decode_tokens_collect gets its tokens)."""

    def decode_tokens_launch_next(self) -> None:
        """Launch the step after the one in flight, its ids taken on the device."""

    def decode_tokens_collect(self) -> dict[tuple[int, int], int]:
        """{(slot, position): token} of the oldest step in flight, {} when none is."""

    def decode_tokens_in_flight(self) -> list[tuple[list[int], list[int]]]:
        """(slots, positions) of the steps in flight, oldest first."""

    # -- capabilities.max_verify_rows > 1 -------------------------------------------------------
    def tokens_rows(self, slot: int, ids: list[int], start: int, row: RowSampling | None = None) -> list[int]:
        """The token after each of ``ids`` (positions start.. of ``slot``) in one step."""

    def logits_rows(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Like tokens_rows, the logits [len(ids), V] on the host."""


def declined(runner: object, capability: str) -> NotImplementedError:
    return NotImplementedError(f"{type(runner).__name__} declines {capability} (see its capabilities)")


def cpu_prefill_chunk(spec: ModelSpec) -> int:
    """Tokens per prefill step on a CPU: a power of two near CPU_PREFILL_CHUNK_FLOPS of work."""
    low, high = CPU_PREFILL_CHUNK_RANGE
    tokens = int(CPU_PREFILL_CHUNK_FLOPS // (2 * layer_param_count(spec)))
    return min(high, max(low, 1 << max(0, tokens.bit_length() - 1)))


class TorchRunner:
    def __init__(self, model: DecoderModel, cache: StaticKVCache, device: torch.device,
                 prefill_chunk: int | None = None):
        """``prefill_chunk``: tokens per prefill step (default: sized to the model on a CPU,
        GPU_PREFILL_CHUNK on a GPU)."""
        self.model = model
        self.cache = cache
        self.device = device
        self.max_context = cache.max_context
        self.num_slots = cache.num_slots
        if prefill_chunk is None:
            prefill_chunk = GPU_PREFILL_CHUNK if device.type == "cuda" else cpu_prefill_chunk(model.spec)
        # the reference path: logits to the host, one token per step
        self.capabilities = RunnerCapabilities(prefill_chunk=prefill_chunk)

    @torch.inference_mode()
    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        return self._last_logits(slot, ids, start)

    @torch.inference_mode()
    def decode(self, slots: list[int], ids: list[int], positions: list[int]) -> torch.Tensor:
        rows = [self._last_logits(slot, [tok], pos) for slot, tok, pos in zip(slots, ids, positions)]
        return torch.stack(rows)

    def _last_logits(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self.model(tokens, start, slot, self.cache)

    @torch.inference_mode()
    def all_logits(self, slot: int, ids: list[int], start: int = 0) -> torch.Tensor:
        """Logits for every position of ``ids`` [T, V] (perplexity, parity tests)."""
        tokens = torch.tensor(ids, dtype=torch.long, device=self.device)
        return self.model(tokens, start, slot, self.cache, all_logits=True)

    def memory_info(self) -> dict:
        # packed weights are buffers, not parameters
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters()) + quantized_nbytes(self.model)
        return {"weights_bytes": weights, "kv_cache_bytes": self.cache.nbytes, "device": str(self.device)}

    def close(self) -> None:
        """Nothing to free: the model and the cache go with the last reference to them."""

    # -- declined: capabilities.pipelined_decode is False ---------------------------------------
    def set_sampling(self, slot, row) -> None:
        raise declined(self, "pipelined_decode")

    def decode_tokens(self, slots, ids, positions) -> list[int]:
        raise declined(self, "pipelined_decode")

    def decode_tokens_launch(self, slots, ids, positions) -> None:
        raise declined(self, "pipelined_decode")

    def decode_tokens_launch_next(self) -> None:
        raise declined(self, "pipelined_decode")

    def decode_tokens_collect(self) -> dict[tuple[int, int], int]:
        raise declined(self, "pipelined_decode")

    def decode_tokens_in_flight(self) -> list[tuple[list[int], list[int]]]:
        raise declined(self, "pipelined_decode")

    # -- declined: capabilities.max_verify_rows is 1 --------------------------------------------
    def tokens_rows(self, slot, ids, start, row=None) -> list[int]:
        raise declined(self, "verify rows (max_verify_rows > 1)")

    def logits_rows(self, slot, ids, start) -> torch.Tensor:
        raise declined(self, "verify rows (max_verify_rows > 1)")
