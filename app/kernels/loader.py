"""The one place that finds, compiles and launches the CUDA kernels.

The ``.cu`` files beside this module are the source of truth. Each is compiled at run time
with NVRTC through CuPy (``cupy-cuda12x`` or ``cupy-cuda13x``), with ``common.cu`` prepended,
for the GPU's own architecture (CuPy adds ``--gpu-architecture=sm_XY`` for the current
device), one template instance at a time on first use. CuPy caches the cubins on disk
(``~/.cupy/kernel_cache`` or ``CUPY_CACHE_DIR``), keyed by the full source, options,
architecture, NVRTC version and instance name, so an edited kernel is rebuilt and an
unchanged one loads in milliseconds.

Kernels launch on PyTorch's current stream with raw ``data_ptr()`` arguments, so they
order correctly with torch ops and can be captured in a ``torch.cuda.CUDAGraph``; on SM90+
through ``cuLaunchKernelEx`` as programmatic dependent launches (:mod:`app.kernels.programmatic`).

Importing this module never fails on a machine without CUDA or CuPy: :func:`available`
is False and :func:`unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from app.errors import CUPY_HINT
from app.kernels import programmatic
from app.kernels.errors import (  # noqa: F401 - re-exported: the kernel modules import them from here
    KernelArgumentError, KernelCompileError, KernelError, KernelUnavailableError,
)
from app.kernels.no_cuda import why_no_cuda

KERNEL_DIR = Path(__file__).resolve().parent
COMMON_SOURCE = "common.cu"
# CuPy itself adds -arch=sm_XY for the device (and -ftz=true); -default-device lets the
# helpers in common.cu be plain functions.
COMPILE_OPTIONS = ("-std=c++17", "-default-device")
MIN_COMPUTE_CAPABILITY = (8, 0)  # mma.sync.m16n8k16 with fp32 accumulation, cvt.rn.f16x2


@functools.lru_cache(maxsize=None)
def _probe() -> str | None:
    """None when the kernels can run here, else the reason they cannot."""
    if not torch.cuda.is_available():
        return why_no_cuda()  # a CPU-only build, no driver, or a driver too old for this PyTorch
    capability = torch.cuda.get_device_capability()
    if capability < MIN_COMPUTE_CAPABILITY:
        return (f"GPU {torch.cuda.get_device_name()} has compute capability "
                f"{capability[0]}.{capability[1]}; the kernels need 8.0 or newer (RTX 30xx / A100 and up)")
    try:
        import cupy  # optional (the cuda12 / cuda13 extra): its absence is the reason returned
    except ImportError as e:
        return f"CuPy is not installed ({e}); {CUPY_HINT}"
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CuPy raises its own CUDARuntimeError types; any of them means no GPU
        return f"CuPy cannot use the GPU: {e}"
    return _nvrtc_reason(cupy)


def _nvrtc_reason(cupy, nvrtc=None) -> str | None:
    """None when NVRTC, the compiler library every kernel is built with, compiles here, else why not.

    CuPy's wheels do not carry it: it comes from a CUDA Toolkit or a pip wheel
    (``nvidia-cuda-nvrtc-cu12``, ``nvidia-cuda-nvrtc`` for CUDA 13), which the ``cuda12`` /
    ``cuda13`` extras install. PyTorch's Linux wheels pull the CUDA 12 one in, its Windows
    wheels do not, so without this check a Windows user without the Toolkit would only learn
    it from the first compile. Loading the library is not enough: NVRTC loads its builtins
    library (``nvrtc-builtins64_*.dll``) only when it compiles, and on Windows that load is
    what fails with the pip wheel's DLLs (NVIDIA/cuda-python#821); so a kernel that does nothing
    is compiled too (milliseconds, once per process: :func:`_probe` is cached). ``nvrtc``:
    CuPy's NVRTC module (tests hand in a stand-in)."""
    try:
        if nvrtc is None:
            from cupy_backends.cuda.libs import nvrtc
        nvrtc.getVersion()
    except Exception as e:  # CuPy 14 raises cuda.pathfinder's DynamicLibNotFoundError, CuPy 13 a RuntimeError
        return f"CuPy cannot load NVRTC, the CUDA compiler library ({_one_line(e)}); {_nvrtc_fix(cupy)}"
    failure = _compile_failure(nvrtc)
    if failure is not None:
        return f"NVRTC, the CUDA compiler library, loads but cannot compile ({failure}); {_nvrtc_fix(cupy)}"
    return None


PROBE_KERNEL = 'extern "C" __global__ void qwen_tray_probe() {}'


def _compile_failure(nvrtc) -> str | None:
    """What NVRTC says when it compiles an empty kernel (its log's first line), None when it can."""
    try:
        program = nvrtc.createProgram(PROBE_KERNEL, "qwen_tray_probe.cu", (), ())
    except Exception as e:  # (never seen; the check must say it, not raise)
        return _one_line(e)
    try:
        nvrtc.compileProgram(program, ())
    except Exception as e:  # CuPy's NVRTCError (NVRTC_ERROR_BUILTIN_OPERATION_FAILURE when the builtins fail)
        log = next((line.strip() for line in nvrtc.getProgramLog(program).splitlines() if line.strip()), "")
        return f"{_one_line(e)}: {log}" if log else _one_line(e)
    finally:
        nvrtc.destroyProgram(program)
    return None


def _nvrtc_fix(cupy) -> str:
    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    wheel = "nvidia-cuda-nvrtc-cu12" if major == 12 else f"nvidia-cuda-nvrtc=={major}.*"
    return f"install it with: pip install \"{wheel}\" (the qwen-tray[cuda{major}] extra includes it)"


def _one_line(error: Exception) -> str:
    detail = " ".join(str(error).split())  # one line: pathfinder's message ends in a newline
    return f"{type(error).__name__}: {detail}"


def available() -> bool:
    """True when a CUDA GPU (SM80+) and CuPy are usable in this process."""
    return _probe() is None


def unavailable_reason() -> str | None:
    """Why the kernels cannot run here, or None when they can."""
    return _probe()


def require() -> None:
    """Raise :class:`KernelUnavailableError` unless the kernels can run here."""
    reason = _probe()
    if reason is not None:
        raise KernelUnavailableError(f"CUDA kernels unavailable: {reason}")


# Files that several kernel files share, put between common.cu and them (NVRTC compiles one text).
PRELUDES = {"temperature_draw.cu": ("draw_common.cu",), "filtered_draw.cu": ("draw_common.cu",)}


def kernel_source(filename: str) -> str:
    """``common.cu``, ``filename``'s preludes, then ``filename``: the exact text NVRTC compiles."""
    parts = []
    for name in (COMMON_SOURCE, *PRELUDES.get(filename, ()), filename):
        path = KERNEL_DIR / name
        if not path.is_file():
            raise KernelCompileError(f"kernel source {path} is missing (broken installation?)")
        parts.append(f'#line 1 "{name}"\n' + path.read_text(encoding="utf-8"))
    return "\n".join(parts)


_compile_lock = threading.Lock()
BuildListener = Callable[[str, str], None]  # (filename, name_expression) of an instance just built
_build_listeners: list[BuildListener] = []


@contextmanager
def watch_builds(listener: BuildListener) -> Iterator[None]:
    """Tell ``listener`` each kernel instance built (compiled, or taken from CuPy's disk cache)
    in this process, from any thread, while the block runs (app.kernels.builds)."""
    with _compile_lock:
        _build_listeners.append(listener)
    try:
        yield
    finally:
        with _compile_lock:
            _build_listeners.remove(listener)


@functools.lru_cache(maxsize=None)
def _compiled(filename: str, name_expression: str, device_index: int):
    import cupy  # optional: only a GPU machine has it, and only a GPU path gets here

    with cupy.cuda.Device(device_index):
        module = cupy.RawModule(code=kernel_source(filename), options=COMPILE_OPTIONS,
                                name_expressions=(name_expression,))
        try:
            function = module.get_function(name_expression)
        except cupy.cuda.compiler.CompileException as e:
            raise KernelCompileError(f"NVRTC failed on {filename} ({name_expression}): {e}") from e
    for listener in _build_listeners:  # (the caller holds _compile_lock: no change meanwhile)
        listener(filename, name_expression)
    return function


def get_kernel(filename: str, name_expression: str):
    """The compiled kernel ``name_expression`` (e.g. ``"gemv_kernel<4, 2, false, 2>"``)."""
    require()
    device_index = torch.cuda.current_device()
    with _compile_lock:  # NVRTC and the CuPy cache are shared by every thread
        return _compiled(filename, name_expression, device_index)


_streams: dict[int, object] = {}


def _cupy_stream(torch_stream):
    """A CuPy view of a torch stream (cached per handle: the wrapper costs microseconds)."""
    handle = torch_stream.cuda_stream
    stream = _streams.get(handle)
    if stream is None:
        import cupy  # optional: only a GPU machine has it, and only a GPU path gets here

        if hasattr(cupy.cuda.Stream, "from_external") and hasattr(torch_stream, "__cuda_stream__"):
            stream = cupy.cuda.Stream.from_external(torch_stream)
        else:  # CuPy 13 or a torch without the CUDA stream protocol
            stream = cupy.cuda.ExternalStream(handle, torch_stream.device.index)
        _streams[handle] = stream
    return stream


_thread_state = threading.local()


def _programmatic(device_index: int) -> bool:
    """Whether this launch is programmatic (app.kernels.programmatic; SM90+ unless turned off)."""
    capability = _capability(device_index)
    if not programmatic.enabled(capability):
        return False
    ready = getattr(_thread_state, "devices", None)
    if ready is None:
        ready = _thread_state.devices = set()
    if device_index not in ready:  # cuLaunchKernelEx needs the context current on this thread
        import cupy  # optional: only a GPU machine has it, and only a GPU path gets here

        cupy.cuda.runtime.setDevice(device_index)
        ready.add(device_index)
    return True


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device_index))


def sm_count(device) -> int:
    """The SM count that GEMV grids and attention splits are planned for. Every such choice asks
    here, so the GPU tests can plan for another card (tests/conftest.py, QWEN_TRAY_TEST_SM_COUNT:
    the RTX 3050 Laptop's 16 SMs on the H200)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def _function_handle(kernel) -> int:
    """The CUfunction of a compiled kernel (CuPy 13: a Function with .ptr; CuPy 14: a RawKernel
    whose .kernel is that Function)."""
    function = kernel if hasattr(kernel, "ptr") else kernel.kernel
    return int(function.ptr)


def programmatic_launches() -> bool:
    """Whether kernels launched now on the current device are programmatic (may start early)."""
    return _programmatic(torch.cuda.current_device())


_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_DYNAMIC_SHARED = 48 << 10  # what a kernel may take without opting in
_shared_granted: dict[int, int] = {}  # CUfunction handle -> dynamic shared bytes it is opted in to


def allow_dynamic_shared(kernel, shared_mem: int) -> bool:
    """Opt ``kernel`` in to ``shared_mem`` bytes of dynamic shared memory (needed above 48 KB);
    False when the driver refuses (more than the GPU grants a block)."""
    if shared_mem <= _DEFAULT_DYNAMIC_SHARED:
        return True
    handle = _function_handle(kernel)
    granted = _shared_granted.get(handle, _DEFAULT_DYNAMIC_SHARED)
    if shared_mem <= granted:
        return True
    driver = programmatic._driver()
    if driver is None or driver.cuFuncSetAttribute(ctypes.c_void_p(handle), ctypes.c_int(_MAX_DYNAMIC_SHARED),
                                                   ctypes.c_int(shared_mem)) != 0:
        return False
    _shared_granted[handle] = shared_mem
    return True


def resident_blocks(kernel, threads: int, shared_mem: int) -> int:
    """How many blocks of ``kernel`` (``threads`` each, ``shared_mem`` dynamic shared bytes) an
    SM holds at once, from the driver's occupancy calculator; 0 when the driver cannot say or
    the shared memory cannot be granted."""
    driver = programmatic._driver()
    if driver is None or not allow_dynamic_shared(kernel, shared_mem):
        return 0
    blocks = ctypes.c_int(0)
    status = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(blocks), ctypes.c_void_p(_function_handle(kernel)), ctypes.c_int(threads),
        ctypes.c_size_t(shared_mem))
    return blocks.value if status == 0 else 0


def launch(kernel, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0) -> None:
    """Launch ``kernel`` on PyTorch's current stream (graph-capturable); programmatic (it may
    overlap the previous kernel's tail, app.kernels.programmatic) where the GPU supports it.

    ``args`` must already have the kernel's C types: ``numpy.int32`` / ``numpy.int64`` /
    ``numpy.float32`` for scalars, Python ints (``data_ptr()``, 0 for null) for pointers.
    """
    if any(d < 1 for d in grid) or any(d < 1 for d in block):
        raise KernelArgumentError(f"empty launch grid={grid} block={block}")
    if not allow_dynamic_shared(kernel, shared_mem):
        raise KernelArgumentError(f"{shared_mem} bytes of dynamic shared memory: more than this GPU grants a block")
    device, handle = _current_stream()
    if _programmatic(device):
        programmatic.launch(_function_handle(kernel), grid, block, args, shared_mem, handle)
        return
    stream = _streams.get(handle)
    if stream is None:
        stream = _cupy_stream(torch.cuda.current_stream())
    with stream:
        kernel(grid, block, args, shared_mem=shared_mem)


def _current_stream() -> tuple[int, int]:
    """(device index, cudaStream_t) of PyTorch's current stream. Two C calls where torch has
    them: ``torch.cuda.current_stream()`` builds a Stream object (device-index checks, an
    environment lookup), which an eager prefill chunk paid ~300 times (probe_prefill_host)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        stream = torch.cuda.current_stream()
        return stream.device.index, stream.cuda_stream
    device = torch.cuda.current_device()
    return device, raw(device)
