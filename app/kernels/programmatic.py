"""Programmatic dependent launch (PDL): let a kernel start before the one it depends on ends.

On SM90 and newer a kernel launched with the attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may be scheduled while the previous
kernel in the stream is still running, once every block of that kernel has executed
``griddepcontrol.launch_dependents``; it then runs ``griddepcontrol.wait`` before it touches
anything the previous kernel writes. Every kernel in ``app/kernels`` does both
(``pdl_launch_dependents()`` first, ``pdl_wait()`` before its first read of an activation
or its first write; the GEMV issues its first weight loads in between), so on a big GPU the
next kernel's launch, block scheduling and first DRAM round trip overlap the tail of the
current one. Decode GEMVs there are one wave long and bounded by exactly that latency chain
(docs/KERNELS.md § Launch plan); the GEMV and attention kernels also ask L2 for the data they
will read while they wait, which adds to the gain. On SM80/SM86 the two PTX instructions
compile to nothing and launches stay plain: the default path of the target GPU (RTX 3050,
SM86) is unchanged.

CuPy cannot pass launch attributes, so programmatic launches go through the driver's
``cuLaunchKernelEx`` with ctypes, with the function handle CuPy compiled. Stream capture
turns them into programmatic edges of the CUDA graph (CUDA 12.3+ drivers).

Mode: ``auto`` (programmatic where the GPU and driver support it), ``on`` (required: an error
where unsupported), ``off``; :func:`set_mode` or the ``QWEN_TRAY_PDL`` environment variable
(``auto`` / ``on`` / ``off``) chooses. Graphs capture the mode in force when they are captured.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct
import sys
import threading

import numpy as np

from app.kernels.errors import KernelArgumentError, KernelError

MODES = ("auto", "on", "off")
ENV_VAR = "QWEN_TRAY_PDL"
MIN_COMPUTE_CAPABILITY = (9, 0)  # griddepcontrol.* (PTX 7.8, sm_90)
MIN_DRIVER_VERSION = 12030  # CUDA 12.3: stream capture records programmatic launches as graph edges
ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: a 4-byte id, 4 bytes of padding, a 64-byte value union (8-aligned)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_mode_override: str | None = None


def set_mode(mode: str | None) -> None:
    """``auto`` / ``on`` / ``off`` for launches from now on; None: back to ``QWEN_TRAY_PDL`` or auto."""
    if mode is not None and mode not in MODES:
        raise KernelArgumentError(f"programmatic launch mode {mode!r}: must be one of {', '.join(MODES)}")
    global _mode_override
    _mode_override = mode


def mode() -> str:
    """The mode in force: :func:`set_mode`'s, else ``QWEN_TRAY_PDL``'s, else ``auto``."""
    if _mode_override is not None:
        return _mode_override
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise KernelError(f"{ENV_VAR}={value!r}: must be one of {', '.join(MODES)}")
    return value


def enabled(capability: tuple[int, int]) -> bool:
    """Whether launches on a GPU of this compute capability are programmatic in the current mode."""
    wanted = mode()
    if wanted == "off":
        return False
    reason = unsupported_reason(capability)
    if reason is not None and wanted == "on":
        raise KernelError(f"{ENV_VAR}=on, but programmatic dependent launch is unavailable: {reason}")
    return reason is None


def unsupported_reason(capability: tuple[int, int], driver_version: int | None = None) -> str | None:
    """Why launches cannot be programmatic here (None: they can). ``driver_version`` as
    cuDriverGetVersion reports it (12030 = CUDA 12.3); by default the installed driver's."""
    if tuple(capability) < MIN_COMPUTE_CAPABILITY:
        return f"compute capability {capability[0]}.{capability[1]} < 9.0"
    if driver_version is None:
        driver_version = _driver_version()
    if driver_version < MIN_DRIVER_VERSION:
        major, minor = divmod(driver_version // 10, 100)
        return f"the CUDA driver supports CUDA {major}.{minor}; CUDA graphs need 12.3 for programmatic launches"
    if _launch_kernel_ex() is None:
        return "the CUDA driver has no cuLaunchKernelEx"
    return None


@functools.lru_cache(maxsize=None)
def _driver():
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        return ctypes.WinDLL(name) if sys.platform == "win32" else ctypes.CDLL(name)
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def _driver_version() -> int:
    """cuDriverGetVersion (e.g. 13000), 0 without a driver."""
    driver = _driver()
    version = ctypes.c_int(0)
    if driver is None or driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return 0
    return version.value


@functools.lru_cache(maxsize=None)
def _launch_kernel_ex():
    """The driver's cuLaunchKernelEx, or None."""
    driver = _driver()
    fn = getattr(driver, "cuLaunchKernelEx", None) if driver is not None else None
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 4  # config, CUfunction, kernel parameters, extra: addresses
    return fn


# Each argument gets an 8-byte slot of one reused buffer (little-endian; a 4-byte value in the
# slot's first half), and the parameter array points at the slots: one struct.pack_into per
# launch instead of a ctypes object per argument (host time matters for eager prefill).
_SLOT_FORMATS = {int: "Q", np.int32: "i4x", np.int64: "q", np.float32: "f4x"}


@functools.lru_cache(maxsize=256)
def argument_format(types: tuple[type, ...]) -> str:
    """The struct format packing arguments of these types: Python int = pointer (8 bytes),
    ``numpy.int32`` / ``numpy.int64`` / ``numpy.float32`` = those C types (what loader.launch takes)."""
    codes = []
    for i, t in enumerate(types):
        code = _SLOT_FORMATS.get(t)
        if code is None:
            raise KernelArgumentError(f"kernel argument {i}: {t.__name__} is not a pointer (int), "
                                      "numpy.int32, numpy.int64 or numpy.float32")
        codes.append(code)
    return "<" + "".join(codes)


class _Scratch(threading.local):
    """Per thread: for each argument count, the slot buffer and the parameter array into it."""

    def __init__(self):
        self.by_count: dict[int, tuple] = {}

    def buffers(self, n: int) -> tuple:
        entry = self.by_count.get(n)
        if entry is None:
            values = (ctypes.c_uint64 * max(1, n))()
            params = (ctypes.c_void_p * max(1, n))(*[ctypes.addressof(values) + 8 * i for i in range(max(1, n))])
            entry = self.by_count[n] = (values, params, ctypes.addressof(params))
        return entry


_scratch = _Scratch()


def pack_arguments(args: tuple, values) -> None:
    """Write ``args`` into ``values`` (a ctypes array of at least len(args) uint64 slots)."""
    struct.pack_into(argument_format(tuple(map(type, args))), values, 0, *args)


@functools.lru_cache(maxsize=1024)
def launch_config(grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int, stream: int):
    """A CUlaunchConfig with the programmatic-serialization attribute (cached: reused as is)."""
    attr = _LaunchAttribute(id=ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1  # programmaticStreamSerializationAllowed (an int at offset 0 of the union)
    g = tuple(grid) + (1,) * (3 - len(grid))
    b = tuple(block) + (1,) * (3 - len(block))
    config = _LaunchConfig(*g, *b, shared_mem, stream, ctypes.pointer(attr), 1)
    config._attr = attr  # the pointer above does not own it
    return config


def launch(function_ptr: int, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int,
           stream: int) -> None:
    """Launch the CUfunction ``function_ptr`` programmatically on the CUstream ``stream``."""
    fn = _launch_kernel_ex()
    if fn is None:
        raise KernelError("cuLaunchKernelEx is unavailable (needs a CUDA 12 driver)")
    values, _, params = _scratch.buffers(len(args))
    pack_arguments(args, values)
    config = launch_config(tuple(grid), tuple(block), shared_mem, stream)
    status = fn(ctypes.addressof(config), function_ptr, params, None)  # copies the arguments before returning
    if status != 0:
        raise KernelError(f"cuLaunchKernelEx failed with CUresult {status} (grid={tuple(grid)}, block={tuple(block)}); "
                          f"{ENV_VAR}=off launches kernels the plain way")
