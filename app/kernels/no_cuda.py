"""Why PyTorch sees no CUDA device, in words that name the fix.

``torch.cuda.is_available()`` is False for different reasons that need different fixes: a
CPU-only build of PyTorch (install the CUDA one), no NVIDIA driver (or no NVIDIA GPU), or a
driver too old for the CUDA version this PyTorch was built with. The last is common on Windows
laptops whose maker's driver lags behind: PyTorch only warns ("The NVIDIA driver on your system
is too old"), and "no GPU" would send the user looking for the wrong problem. The driver says
which CUDA version it supports itself (cuDriverGetVersion, read without PyTorch), so the three
are told apart here.
"""

from __future__ import annotations

import os

from app.kernels import programmatic

DRIVER_DOWNLOAD = "https://www.nvidia.com/drivers, or the laptop maker's support page"


def why_no_cuda() -> str:
    """Why ``torch.cuda.is_available()`` is False on this machine (call it only then)."""
    import torch

    return no_cuda_reason(torch.version.cuda, programmatic._driver_version(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def driver_cuda_version() -> str | None:
    """The CUDA version the installed NVIDIA driver supports ("12.8"); None without a driver."""
    version = programmatic._driver_version()
    return _cuda_version(version) if version else None


def no_cuda_reason(cuda_build: str | None, driver_version: int, visible_devices: str | None = None) -> str:
    """Why PyTorch sees no CUDA device, from ``cuda_build`` (``torch.version.cuda``: "12.4", None
    for a CPU-only build), ``driver_version`` (cuDriverGetVersion: 12020 is CUDA 12.2, 0 without
    a driver) and ``visible_devices`` (``CUDA_VISIBLE_DEVICES``, None when unset)."""
    driver = _cuda_version(driver_version)
    if cuda_build is None:
        installed = f", although an NVIDIA driver (CUDA {driver}) is installed" if driver_version else ""
        return (f"this PyTorch is a CPU-only build{installed}; the GPU needs a CUDA build of PyTorch "
                "(https://pytorch.org/get-started/locally/)")
    if not driver_version:
        return (f"no NVIDIA driver was found (this PyTorch is a CUDA {cuda_build} build): no NVIDIA GPU, "
                f"or its driver is not installed ({DRIVER_DOWNLOAD})")
    if _major_minor(driver) < _major_minor(cuda_build):
        return (f"the NVIDIA driver is too old for this PyTorch: it supports CUDA {driver}, PyTorch was built for "
                f"CUDA {cuda_build}; update the NVIDIA driver ({DRIVER_DOWNLOAD})")
    if visible_devices is not None:
        return (f"PyTorch (a CUDA {cuda_build} build) sees no CUDA device with CUDA_VISIBLE_DEVICES="
                f"{visible_devices!r}; unset it, or name a GPU that exists")
    return (f"PyTorch (a CUDA {cuda_build} build) sees no CUDA device although an NVIDIA driver (CUDA {driver}) "
            "is installed; `nvidia-smi` shows whether the driver sees the GPU")


def _cuda_version(driver_version: int) -> str:
    major, minor = divmod(driver_version // 10, 100)
    return f"{major}.{minor}"


def _major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".")[:2])
