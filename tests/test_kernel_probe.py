"""Why the CUDA kernels cannot run, told apart on a machine without a GPU: NVRTC that loads but
cannot compile (Windows: the pip wheel's nvrtc-builtins DLL), and a PyTorch that sees no CUDA
device because it is a CPU-only build, because there is no driver, or because the driver is
too old for the CUDA version PyTorch was built with. The GPU side: tests/test_kernels_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.kernels import loader
from app.kernels.no_cuda import DRIVER_DOWNLOAD, no_cuda_reason

CUPY_12 = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(runtimeGetVersion=lambda: 12080)))
BUILTINS_LOG = ("nvrtc: error: failed to open nvrtc-builtins64_129.dll.\n"
                "  Make sure that nvrtc-builtins64_129.dll is installed correctly.\n")
FIX = 'install it with: pip install "nvidia-cuda-nvrtc-cu12" (the qwen-tray[cuda12] extra includes it)'


class NVRTCError(RuntimeError):
    """As CuPy's (cupy_backends.cuda.libs.nvrtc.NVRTCError) reads."""


class StandInNvrtc:
    """CuPy's NVRTC module as the check calls it; ``compile_error`` is what compileProgram raises."""

    def __init__(self, compile_error: Exception | None = None, log: str = "", version_error: Exception | None = None):
        self.compile_error, self.log, self.version_error = compile_error, log, version_error
        self.compiled: list[str] = []
        self.destroyed = 0

    def getVersion(self):  # noqa: N802 - CuPy's names
        if self.version_error is not None:
            raise self.version_error
        return 12, 9

    def createProgram(self, source, name, headers, include_names):  # noqa: N802
        self.compiled.append(source)
        return 1

    def compileProgram(self, program, options):  # noqa: N802
        if self.compile_error is not None:
            raise self.compile_error

    def getProgramLog(self, program):  # noqa: N802
        return self.log

    def destroyProgram(self, program):  # noqa: N802
        self.destroyed += 1


def test_nvrtc_that_loads_but_cannot_compile_is_said_with_its_own_words_and_the_fix():
    nvrtc = StandInNvrtc(NVRTCError("NVRTC_ERROR_BUILTIN_OPERATION_FAILURE (7)"), BUILTINS_LOG)
    assert loader._nvrtc_reason(CUPY_12, nvrtc) == (
        "NVRTC, the CUDA compiler library, loads but cannot compile (NVRTCError: "
        "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE (7): nvrtc: error: failed to open nvrtc-builtins64_129.dll.); " + FIX)
    assert nvrtc.compiled == [loader.PROBE_KERNEL] and nvrtc.destroyed == 1  # (was: only getVersion() was asked)


def test_nvrtc_that_compiles_passes_and_one_that_does_not_load_is_said_as_before():
    compiles = StandInNvrtc()
    assert loader._nvrtc_reason(CUPY_12, compiles) is None and compiles.destroyed == 1
    missing = StandInNvrtc(version_error=RuntimeError("CuPy failed to load nvrtc64_120_0.dll\n"))
    assert loader._nvrtc_reason(CUPY_12, missing) == (
        "CuPy cannot load NVRTC, the CUDA compiler library (RuntimeError: CuPy failed to load nvrtc64_120_0.dll); "
        + FIX)
    assert missing.compiled == []


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
