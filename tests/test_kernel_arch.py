"""Which architecture the kernels are built for: the GPU's own (cubins), or, with
QWEN_TRAY_TEST_KERNEL_ARCH=86 (tests/conftest.py), PTX for the RTX 3050's SM86 that the driver
compiles for the GPU at hand, so a newer GPU runs the SM86 code path."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import KERNEL_ARCH_VAR


@pytest.mark.gpu
def test_kernels_are_built_for_the_architecture_asked_for():
    from app.kernels import loader, programmatic

    kernel = loader.get_kernel("norm.cu", "rms_norm_kernel")
    major, minor = torch.cuda.get_device_capability()
    assert kernel.binary_version == 10 * major + minor  # what runs is machine code for this GPU
    asked = os.environ.get(KERNEL_ARCH_VAR)
    if asked:
        assert kernel.ptx_version == int(asked)  # compiled from SM86 PTX by the driver
        assert not programmatic.enabled((major, minor))  # SM86 code has no wait to launch early
