"""Why the CUDA kernels cannot run, told apart on a machine without a GPU: a PyTorch that sees no CUDA
device because it is a CPU-only build, because there is no driver, or because the driver is
too old for the CUDA version PyTorch was built with. The GPU side: tests/test_kernels_gpu.py."""

from __future__ import annotations

import pytest

from app.kernels.no_cuda import DRIVER_DOWNLOAD, no_cuda_reason


@pytest.mark.parametrize("cuda_build, driver, visible, said", [
    ("12.4", 11080, None, "the NVIDIA driver is too old for this PyTorch: it supports CUDA 11.8, PyTorch was built "
                          f"for CUDA 12.4; update the NVIDIA driver ({DRIVER_DOWNLOAD})"),
    ("12.4", 12020, None, "the NVIDIA driver is too old for this PyTorch: it supports CUDA 12.2, PyTorch was built "
                          f"for CUDA 12.4; update the NVIDIA driver ({DRIVER_DOWNLOAD})"),
    ("12.4", 0, None, "no NVIDIA driver was found (this PyTorch is a CUDA 12.4 build): no NVIDIA GPU, or its driver "
                      f"is not installed ({DRIVER_DOWNLOAD})"),
    (None, 0, None, "this PyTorch is a CPU-only build; the GPU needs a CUDA build of PyTorch "
                    "(https://pytorch.org/get-started/locally/)"),
    (None, 12080, None, "this PyTorch is a CPU-only build, although an NVIDIA driver (CUDA 12.8) is installed; the "
                        "GPU needs a CUDA build of PyTorch (https://pytorch.org/get-started/locally/)"),
    ("12.4", 12080, "", "PyTorch (a CUDA 12.4 build) sees no CUDA device with CUDA_VISIBLE_DEVICES=''; unset it, "
                        "or name a GPU that exists"),
    ("12.4", 12080, None, "PyTorch (a CUDA 12.4 build) sees no CUDA device although an NVIDIA driver (CUDA 12.8) is "
                          "installed; `nvidia-smi` shows whether the driver sees the GPU"),
], ids=["driver-11.8", "driver-12.2", "no-driver", "cpu-build", "cpu-build-with-driver", "hidden", "other"])
def test_no_cuda_device_is_told_apart_from_a_driver_too_old(cuda_build, driver, visible, said):
    assert no_cuda_reason(cuda_build, driver, visible) == said
