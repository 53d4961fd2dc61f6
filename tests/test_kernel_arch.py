"""Which architecture the kernels are built for: the GPU's own (cubins), or, with
QWEN_TRAY_TEST_KERNEL_ARCH=86 (tests/conftest.py), PTX for the RTX 3050's SM86 that the driver
compiles for the GPU at hand, so a newer GPU runs the SM86 code path; and the SM count grids are
planned for (QWEN_TRAY_TEST_SM_COUNT=16: the 3050's)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import KERNEL_ARCH_VAR, SM_COUNT_VAR


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



@pytest.mark.gpu
def test_grids_are_planned_for_the_sm_count_asked_for():
    from app.engine.cuda.memory import GpuInfo
    from app.kernels import gemv, loader

    device = torch.device("cuda", 0)
    asked = os.environ.get(SM_COUNT_VAR)
    sms = int(asked) if asked else torch.cuda.get_device_properties(device).multi_processor_count
    # the planner's splits and the kernels' grids read the same count
    assert loader.sm_count(device) == GpuInfo.of(device).sm_count == sms
    blocks = gemv.default_gemv_config(18944, 3584, True, sms).grid(18944, True)[0]  # the 7B gate/up
    assert gemv.norm_prologue_bytes(18944, 3584, True, device) == blocks * (2 * 3584 * 2 + 3584 // 16 * 4)


def test_plan_for_sm_count_changes_what_the_grids_are_planned_for(monkeypatch):
    from app.kernels import emulate, gemv, loader

    monkeypatch.setattr(loader, "sm_count", loader.sm_count)  # put back after the test
    emulate.plan_for_sm_count(16)
    assert loader.sm_count("cuda") == 16
    # what the 7B gate/up's prologue rule then sees: the 3050's grid, not this machine's
    blocks = gemv.default_gemv_config(18944, 3584, True, 16).grid(18944, True)[0]
    assert gemv.norm_prologue_bytes(18944, 3584, True, "cuda") == blocks * (2 * 3584 * 2 + 3584 // 16 * 4)
    with pytest.raises(ValueError, match="positive"):
        emulate.plan_for_sm_count(0)
