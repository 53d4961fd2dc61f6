"""``qwen-tray doctor``: what this machine gives the engine, and how each registered model would load.

For a user's first question ("why is it slow / on the CPU / refused?") and for bug reports:
versions, the GPU and its free VRAM, whether the CUDA kernels can run (and why not), and for
every registered model the tray's load (4 requests of up to 4,096 tokens, fitted to the card)
planned from its files without loading it.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
from pathlib import Path

from app import __version__
from app.errors import QwenTrayError

TRAY_SLOTS = 4  # Engine.load's default, which the tray keeps (LocalEngineBackend.load)
FLOAT16_FOLDER = "float16 folder"


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the GPU, the CUDA kernels and how each model would load",
                       description="Check the GPU, the CUDA kernels and how each registered model would load.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from app.kernels import unavailable_reason

    print(f"qwen-tray {__version__}, Python {platform.python_version()}, {platform.platform(terse=True)}")
    cuda_build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    print(f"PyTorch {torch.__version__} ({cuda_build})")
    print(_cupy_line())
    gpu = _gpu()
    print(_gpu_line(gpu))
    reason = unavailable_reason()
    print("CUDA kernels: available" if reason is None else f"CUDA kernels: unavailable: {reason}")
    print(f"Kernel cache: {_kernel_cache_dir()}")
    logging.disable(logging.WARNING)  # the plans' own warnings (a fitted load) would repeat each verdict
    try:
        _print_models(gpu, reason)
    finally:
        logging.disable(logging.NOTSET)
    return 0


def _cupy_line() -> str:
    try:
        import cupy
    except ImportError:
        return "CuPy: not installed (pip install 'qwen-tray[cuda12]')"
    try:
        from cupy_backends.cuda.libs import nvrtc

        major, minor = nvrtc.getVersion()
        compiler = f"NVRTC {major}.{minor}"
    except Exception as e:  # the library's own loader errors (see app.kernels.loader._nvrtc_reason)
        compiler = f"NVRTC not found ({type(e).__name__})"
    return f"CuPy {cupy.__version__}, {compiler}"


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


def _print_models(gpu, reason: str | None) -> None:
    from app.settings import load_settings

    settings = load_settings()
    if not settings.models:
        print("Models: none registered; run `qwen-tray models add-starter`")
        return
    print(f"Models (the tray's load: {TRAY_SLOTS} requests, fitted to the card):")
    for name, path in sorted(settings.models.items()):
        mark = "*" if name == settings.default_model else " "
        try:
            verdict = _model_verdict(Path(path), name, gpu, reason)
        except QwenTrayError as e:  # a broken folder: say so and go on with the others
            verdict = f"cannot be read: {e}"
        print(f"{mark} {name}: {verdict}")


def _model_verdict(path: Path, name: str, gpu, reason: str | None) -> str:
    from app.engine.cuda.memory import VramBudgetError, gib

    if not path.is_dir():
        return f"missing ({path})"
    spec, weights, kind = model_weights(path)
    where = f"{kind}, {gib(weights)} of weights"
    if gpu is None:
        return f"{where}; on the CPU"
    try:
        if reason is None:
            return f"{where}; on the GPU as {_tray_plan(spec, weights, gpu, name, kind)}"
        return f"{where}; {_reference_plan(spec, gpu, name, reason)}"
    except VramBudgetError as e:
        return f"{where}; refused: {e}"


def model_weights(path: Path):
    """(spec, weight bytes as the GPU holds them, kind) of a model folder, from its metadata."""
    from app.engine.cuda.memory import spec_to_hf_config
    from app.formats.spec import ModelSpec
    from app.formats import checkpoint
    from app.formats.recipe import Recipe, hf_tensor_shapes, plan_model

    if checkpoint.is_checkpoint(path):
        manifest = checkpoint.read_manifest(path)
        weights = sum(t.nbytes for t in manifest.tensors.values())
        return manifest.spec, weights, f"'{manifest.recipe.name}' checkpoint"
    spec = ModelSpec.from_hf_folder(path)
    weights = plan_model(Recipe("float16", ()), hf_tensor_shapes(spec_to_hf_config(spec))).total_bytes
    return spec, weights, FLOAT16_FOLDER


def _tray_plan(spec, weights: int, gpu, name: str, kind: str) -> str:
    from app.engine.cuda.load_plan import plan_load
    from app.engine.loading import context_length

    quantized = kind != FLOAT16_FOLDER
    plan = plan_load(spec, weights, gpu, num_slots=TRAY_SLOTS, vram_budget=None, label=name, fit=True,
                     max_context=context_length(spec.max_position_embeddings, None),
                     dense_decode=not quantized, quantized=quantized)
    return f"{plan.num_slots} x {plan.max_context} tokens ({plan.describe()})"


def _reference_plan(spec, gpu, name: str, reason: str) -> str:
    import torch

    from app.engine.cuda.reference_fit import reference_device
    from app.engine.loading import context_length

    context = context_length(spec.max_position_embeddings, None)
    device = reference_device(spec, asked="auto", reason=reason, num_slots=TRAY_SLOTS, context=context,
                              vram_budget=None, gpu=gpu, device=torch.device("cuda"), label=name)
    return "with PyTorch on the GPU" if device.type == "cuda" else "on the CPU (too large for the GPU without the kernels)"

