"""Argument checks at every kernel boundary: a wrong tensor is a clear error, never a crash.

Pure Python over tensor metadata, so the CPU test suite exercises them too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from app.kernels.loader import KernelArgumentError

ALIGNMENT = 16  # the kernels use 16-byte vector loads


def check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype, shape: Sequence[int | None],
                 *, device: torch.device | None = None, aligned: bool = True) -> torch.Tensor:
    """Require dtype, exact shape (None = any size), contiguity, CUDA and 16-byte alignment."""
    if not isinstance(t, torch.Tensor):
        raise KernelArgumentError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise KernelArgumentError(f"{name}: dtype must be {dtype}, got {t.dtype}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise KernelArgumentError(f"{name}: shape must be {want}, got {list(t.shape)}")
    if t.device.type != "cuda":
        raise KernelArgumentError(f"{name}: must be on a CUDA device, got {t.device}")
    if device is not None and t.device != device:
        raise KernelArgumentError(f"{name}: must be on {device} like the other inputs, got {t.device}")
    if not t.is_contiguous():
        raise KernelArgumentError(f"{name}: must be contiguous (call .contiguous() first)")
    if aligned and t.data_ptr() % ALIGNMENT:
        raise KernelArgumentError(f"{name}: data must be {ALIGNMENT}-byte aligned (a sliced view?)")
    return t


def check_optional(name: str, t: torch.Tensor | None, dtype: torch.dtype, shape: Sequence[int | None],
                   *, device: torch.device | None = None, aligned: bool = True) -> int:
    """Like :func:`check_tensor` for an optional input; returns its pointer (0 for None)."""
    if t is None:
        return 0
    return check_tensor(name, t, dtype, shape, device=device, aligned=aligned).data_ptr()


def check_range(name: str, value: int, low: int, high: int) -> int:
    """Require low <= value <= high for a size that the kernels support."""
    if not low <= value <= high:
        raise KernelArgumentError(f"{name}={value} is outside the supported range {low}..{high}")
    return value


def check_multiple(name: str, value: int, of: int) -> int:
    if value % of:
        raise KernelArgumentError(f"{name}={value} must be a multiple of {of}")
    return value


def ensure_output(name: str, out: torch.Tensor | None, shape: Sequence[int], dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """The caller's output buffer, checked, or a new one."""
    if out is None:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    return check_tensor(name, out, dtype, shape, device=device)


def no_overlap(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    """Reject two buffers that share memory where the kernel reads one while writing the other."""
    a_start, b_start = a.data_ptr(), b.data_ptr()
    a_end = a_start + a.numel() * a.element_size()
    b_end = b_start + b.numel() * b.element_size()
    if a_start < b_end and b_start < a_end:
        raise KernelArgumentError(f"{name_a} and {name_b} must not overlap")
