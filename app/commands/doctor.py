"""``qwen-tray doctor``: what this machine gives the engine, and how each registered model would load.

For a user's first question ("why is it slow / on the CPU / refused?") and for bug reports:
versions, the GPU and its free VRAM, whether the CUDA kernels can run (and why not), and for
every registered model the tray's load (4 requests of up to 4,096 tokens, fitted to the card)
planned from its files without loading it. Each model's tokenizer is parsed and its weight
files' headers (or a checkpoint's file sizes) are read, no weights: the exit status is 1 when a
registered model is missing or broken, so a script can rely on it.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
from pathlib import Path

from app import __version__
from app.errors import CUPY_HINT, QwenTrayError


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the GPU, the CUDA kernels and how each model would load",
                       description="Check the GPU, the CUDA kernels and how each registered model would load "
                                   "(its tokenizer and weight files' headers are read, not its weights). Exit "
                                   "status: 0, or 1 when a registered model is missing or broken.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from app.kernels import unavailable_reason
    from app.settings.console import console_store

    # Its notices (a broken settings file and where it went; API keys kept as plain text, which
    # other commands say once) go to stderr now.
    store = console_store(every_notice=True)
    settings = store.load()
    print(f"qwen-tray {__version__}, Python {platform.python_version()}, {platform.platform(terse=True)}")
    cuda_build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    print(f"PyTorch {torch.__version__} ({cuda_build})")
    print(_driver_line())
    print(_cupy_line())
    gpu = _gpu()
    print(_gpu_line(gpu))
    reason = unavailable_reason()
    print("CUDA kernels: available" if reason is None else f"CUDA kernels: unavailable: {reason}")
    print(f"Kernel cache: {_kernel_cache_dir()}")
    print(f"Settings: {store.path}")
    logging.disable(logging.WARNING)  # the plans' own warnings (a fitted load) would repeat each verdict
    unread = store.unread_registry()
    try:
        if unread is None:
            broken = _print_models(settings, gpu, reason)
        else:  # "none registered" would be wrong: they are in a file that could not be read
            print(f"Models: cannot be listed: {unread} (exit status 1)")
            return 1
    finally:
        logging.disable(logging.NOTSET)
    if broken:
        print(f"{len(broken)} registered {'model cannot' if len(broken) == 1 else 'models cannot'} be loaded: "
              f"{', '.join(broken)} (exit status 1)")
    return 1 if broken else 0


def _cupy_line() -> str:
    try:
        import cupy
    except ImportError:
        return f"CuPy: not installed ({CUPY_HINT})"
    try:
        from cupy_backends.cuda.libs import nvrtc

        major, minor = nvrtc.getVersion()
        compiler = f"NVRTC {major}.{minor}"
    except Exception as e:  # the library's own loader errors (see app.kernels.loader._nvrtc_reason)
        compiler = f"NVRTC not found ({type(e).__name__})"
    return f"CuPy {cupy.__version__}, {compiler}"


def _driver_line() -> str:
    """The NVIDIA driver's CUDA version: beside PyTorch's, it shows a driver too old for it."""
    from app.kernels.no_cuda import driver_cuda_version

    version = driver_cuda_version()
    return f"NVIDIA driver: supports CUDA {version}" if version else "NVIDIA driver: none found"


def _gpu():
    """The first CUDA device's facts (app.engine.cuda.memory.GpuInfo), or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    from app.engine.cuda.memory import GpuInfo

    return GpuInfo.of(torch.device("cuda"))


def _gpu_line(gpu) -> str:
    if gpu is None:
        return "GPU: none visible to PyTorch"
    from app.engine.cuda.memory import default_budget, gib

    major, minor = gpu.capability
    budget = default_budget(gpu)
    budget_text = f"default VRAM budget {gib(budget)}" if budget > 0 else "too little free for a model"
    return (f"GPU: {gpu.name}, SM {major}.{minor}, {gpu.sm_count} SMs, {gib(gpu.total_bytes)} "
            f"({gib(gpu.free_bytes)} free; {budget_text})")


def _kernel_cache_dir() -> str:
    return os.environ.get("CUPY_CACHE_DIR") or str(Path.home() / ".cupy" / "kernel_cache")


def model_weights(path: Path):
    """(spec, weight bytes, kind) of a model folder, from its files alone."""
    # (fit imports torch: imported here, not by every `qwen-tray` command that builds the parser)
    from app.engine.cuda.fit import folder_weights

    return folder_weights(path)


def _print_models(settings, gpu, reason: str | None) -> list[str]:
    """Print each registered model's verdict; return the names of those that cannot be loaded."""
    from app.engine.cuda.fit import TRAY_SLOTS

    if not settings.models:
        print("Models: none registered; run `qwen-tray models catalog` to get one (or `models add-starter` for a small demo)")
        return []
    print(f"Models (the tray's load: {TRAY_SLOTS} requests, fitted to the card):")
    broken = []
    for entry in sorted(settings.models, key=lambda e: e.name.casefold()):
        mark = "*" if entry.name == settings.default_model else " "
        if entry.kind != "local":
            print(f"{mark} {entry.name}: {entry.describe()}")
            continue
        verdict, loads = _local_verdict(Path(entry.path).expanduser(), entry.name, gpu, reason)
        if not loads:
            broken.append(entry.name)
        print(f"{mark} {entry.name}: {verdict}")
    return broken


def _local_verdict(path: Path, name: str, gpu, reason: str | None) -> tuple[str, bool]:
    """(what doctor says of a local model, whether it would load)."""
    if not path.is_dir():
        return f"missing ({path})", False
    try:
        verdict = _model_verdict(path, name, gpu, reason)
        check_model_files(path)
    except QwenTrayError as e:  # a broken folder: say so and go on with the others
        return f"cannot be read: {e}", False
    return verdict, True


def check_model_files(path: Path) -> None:
    """Raise ModelLoadError naming a file the model cannot load from: the tokenizer (parsed), a
    float16 folder's safetensors headers (a truncated file fails there), a checkpoint's files
    against the sizes in its manifest. No weights are read (`checkpoint info --verify` checks a
    checkpoint's checksums)."""
    from app.engine.tokenizer import Tokenizer
    from app.engine.weights import TensorSource
    from app.formats import checkpoint

    Tokenizer.from_folder(path)
    if checkpoint.is_checkpoint(path):
        for file_name, entry in checkpoint.read_manifest(path).files.items():
            checkpoint.check_file(path / file_name, entry, checksum=False)
        return
    with TensorSource(path) as source:
        source.check_headers()


def _model_verdict(path: Path, name: str, gpu, reason: str | None) -> str:
    from app.engine.cuda.fit import FLOAT16_FOLDER, Machine, model_fit
    from app.engine.cuda.memory import gib

    if not path.is_dir():
        return f"missing ({path})"
    spec, weights, kind = model_weights(path)
    fit = model_fit(spec, weights, quantized=kind != FLOAT16_FOLDER, machine=Machine(gpu, reason), label=name)
    return f"{kind}, {gib(weights)} of weights; {fit.text}"
