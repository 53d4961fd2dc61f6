"""Run another GPU's code path on this one: for the GPU tests and benchmarks, never the product.

The product compiles every kernel for the GPU at hand and plans its grids for that GPU's SM
count. The only GPU the team can test on is an H200 (SM90, 132 SMs); the product's target is
an RTX 3050 Laptop (SM86, 16 SMs). :func:`build_as_ptx` makes CuPy build the kernels as PTX
for another compute capability, which the driver then compiles for the GPU at hand, so the
H200 runs the 3050's ``__CUDA_ARCH__ < 900`` branches (programmatic launches off: that code
has no wait to launch early). :func:`plan_for_sm_count` makes every grid and attention split
be planned for another SM count (``loader.sm_count``). ``tests/conftest.py`` applies them from
QWEN_TRAY_TEST_KERNEL_ARCH / QWEN_TRAY_TEST_SM_COUNT; ``benchmarks/probe_3050_proxy.py`` too.
"""

from __future__ import annotations

import os

from app.kernels import loader, programmatic


class EmulationError(RuntimeError):
    """This CuPy cannot be made to build for another architecture."""


def build_as_ptx(arch: str) -> None:
    """Compile every kernel from now on as compute_``arch`` PTX (e.g. "86") and launch none
    programmatically. Call before the first kernel is built."""
    os.environ[programmatic.ENV_VAR] = "off"
    from cupy.cuda import compiler  # optional: only a GPU machine has CuPy

    # CuPy's own choice of architecture (private functions, read on every compile; the disk
    # cache key includes the architecture, so these PTX modules never mix with the cubins).
    if not (hasattr(compiler, "_get_arch") and hasattr(compiler, "_use_ptx")):
        raise EmulationError("this CuPy has no compiler._get_arch / _use_ptx to override")
    compiler._get_arch = lambda: arch
    compiler._use_ptx = True


def plan_for_sm_count(sms: int) -> None:
    """Plan every GEMV grid and attention split from now on for ``sms`` SMs."""
    if sms < 1:
        raise ValueError(f"an SM count must be positive, got {sms}")
    loader.sm_count = lambda device: sms
