"""The kernel layer's errors (one module, so the loader and the launch paths can share them)."""

from __future__ import annotations

from app.errors import QwenTrayError


class KernelError(QwenTrayError):
    """Base class of the kernel layer's errors."""


class KernelUnavailableError(KernelError):
    """No usable CUDA device, or CuPy is missing (the message says which)."""


class KernelCompileError(KernelError):
    """NVRTC rejected a kernel source (the message names the file and instance)."""


class KernelArgumentError(KernelError, ValueError):
    """A tensor passed to a kernel has the wrong dtype, shape, device or layout."""
