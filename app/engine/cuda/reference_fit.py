"""Whether a model fits the GPU on PyTorch's reference path, where the CUDA kernels cannot run.

The CUDA runner keeps a checkpoint's weights packed (the 7B `mixed` in 2.93 GiB); PyTorch's
path computes with them dequantized to float16, about five times the bytes (the 7B: 14 GiB).
Where the kernels cannot run (a GPU older than SM80, CuPy or NVRTC missing, a head size they
do not cover), loading such a model onto a 4 GB card would end in CUDA's out-of-memory error
halfway through. So the reference path is planned too: what does not fit the VRAM budget runs
on the CPU when the device was "auto", and is refused in one line when it was "cuda".
"""

from __future__ import annotations

import logging

import torch

from app.engine.cuda.memory import FP16, MiB, GpuInfo, VramBudgetError, gib, kv_bytes_per_token, resolve_budget
from app.engine.loading import param_count
from app.formats.spec import ModelSpec

log = logging.getLogger(__name__)

# Activations, cuBLAS's workspace and the logits of a prefill chunk on PyTorch's path.
REFERENCE_RUNTIME_BYTES = 256 * MiB


def reference_need_bytes(spec: ModelSpec, num_slots: int, context: int,
                         dtype: torch.dtype = torch.float16) -> tuple[int, int]:
    """(dense weights, KV cache) bytes of ``spec`` on PyTorch's path, in ``dtype``."""
    size = torch.empty((), dtype=dtype).element_size()
    return size * param_count(spec), kv_bytes_per_token(spec) // FP16 * size * num_slots * context


def reference_device(spec: ModelSpec, *, asked: str, reason: str, num_slots: int, context: int,
                     vram_budget: int | None, gpu: GpuInfo, device: torch.device, dtype: torch.dtype = torch.float16,
                     label: str = "the model") -> torch.device:
    """The device for PyTorch's path once ``reason`` keeps the CUDA runner out: ``device`` (the
    GPU) when the dense model, its cache and the runtime fit the budget; else the CPU if
    ``asked`` was "auto"; else :class:`VramBudgetError` saying why and what to do."""
    budget = resolve_budget(vram_budget, gpu)
    weights, cache = reference_need_bytes(spec, num_slots, context, dtype)
    need = weights + cache + REFERENCE_RUNTIME_BYTES
    if need <= budget:
        log.warning("running %s with PyTorch on %s (slower than its kernels): %s", label, device, reason)
        return device
    why = (f"{label} needs {gib(need)} of VRAM on PyTorch's path ({dtype_name(dtype)} weights {gib(weights)} + KV cache "
           f"{gib(cache)} ({num_slots} x {context} tokens) + runtime {REFERENCE_RUNTIME_BYTES // MiB} MiB), more "
           f"than the budget of {gib(budget)}, and the CUDA kernels cannot run here: {reason}")
    if asked == "auto":
        log.warning("%s; running on the CPU", why)
        return torch.device("cpu")
    raise VramBudgetError(f"{why}; fix that, or use --device cpu")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")

