"""Where a model would run on this machine under the tray's load, planned from its shape alone.

One verdict for `qwen-tray doctor` (each registered model) and the model catalog (before a
download): the tray's load (4 requests of up to the model's context, fitted to the card by
load_plan.py) on the CUDA kernels when they can run; else PyTorch's dense path planned by
reference_fit.py (the GPU if it fits, else the CPU); the CPU without a GPU. Nothing is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine.cuda.memory import GpuInfo, VramBudgetError
from app.formats.spec import ModelSpec

TRAY_SLOTS = 4  # Engine.load's default, which the tray keeps (LocalEngineBackend.load)

GPU, GPU_PYTORCH, CPU, REFUSED = "gpu", "gpu-pytorch", "cpu", "refused"
FLOAT16_FOLDER = "float16 folder"


@dataclass(frozen=True)
class Machine:
    """The GPU (None without one) and why the CUDA kernels cannot run on it (None: they can)."""

    gpu: GpuInfo | None
    kernels_unavailable: str | None = None

    @classmethod
    def detect(cls) -> Machine:
        import torch

        if not torch.cuda.is_available():
            return cls(None, "no CUDA GPU")
        from app.kernels import unavailable_reason

        return cls(GpuInfo.of(torch.device("cuda")), unavailable_reason())


@dataclass(frozen=True)
class Fit:
    where: str  # GPU (the kernels), GPU_PYTORCH, CPU or REFUSED
    text: str  # e.g. "on the GPU as 4 x 4096 tokens (...)"

    @property
    def on_gpu(self) -> bool:
        return self.where in (GPU, GPU_PYTORCH)


def model_fit(spec: ModelSpec, weights_bytes: int, *, quantized: bool, machine: Machine, label: str) -> Fit:
    """The tray's load of a model with ``weights_bytes`` of weights (packed, or float16) here."""
    if machine.gpu is None:
        return Fit(CPU, "on the CPU")
    try:
        if machine.kernels_unavailable is None:
            return Fit(GPU, "on the GPU as " + _tray_plan(spec, weights_bytes, machine.gpu, label, quantized))
        return _reference_fit(spec, machine.gpu, label, machine.kernels_unavailable)
    except VramBudgetError as e:
        return Fit(REFUSED, f"refused: {e}")


def _tray_plan(spec: ModelSpec, weights: int, gpu: GpuInfo, label: str, quantized: bool) -> str:
    from app.engine.cuda.load_plan import plan_load
    from app.engine.loading import context_length

    plan = plan_load(spec, weights, gpu, num_slots=TRAY_SLOTS, vram_budget=None, label=label, fit=True,
                     max_context=context_length(spec.max_position_embeddings, None),
                     dense_decode=not quantized, quantized=quantized)
    return f"{plan.num_slots} x {plan.max_context} tokens ({plan.describe()})"


def _reference_fit(spec: ModelSpec, gpu: GpuInfo, label: str, reason: str) -> Fit:
    import torch

    from app.engine.cuda.reference_fit import reference_device
    from app.engine.loading import context_length

    context = context_length(spec.max_position_embeddings, None)
    device = reference_device(spec, asked="auto", reason=reason, num_slots=TRAY_SLOTS, context=context,
                              vram_budget=None, gpu=gpu, device=torch.device("cuda"), label=label)
    if device.type == "cuda":
        return Fit(GPU_PYTORCH, "with PyTorch on the GPU")
    return Fit(CPU, "on the CPU (too large for the GPU without the kernels)")


def folder_weights(path: Path) -> tuple[ModelSpec, int, str]:
    """(spec, weight bytes as the GPU holds them, kind) of a model folder, from its metadata:
    a checkpoint's manifest, or a float16 folder's config.json."""
    from app.engine.cuda.memory import spec_to_hf_config
    from app.formats import checkpoint
    from app.formats.recipe import Recipe, hf_tensor_shapes, plan_model

    if checkpoint.is_checkpoint(path):
        manifest = checkpoint.read_manifest(path)
        weights = sum(t.nbytes for t in manifest.tensors.values())
        return manifest.spec, weights, f"'{manifest.recipe.name}' checkpoint"
    spec = ModelSpec.from_hf_folder(path)
    weights = plan_model(Recipe("float16", ()), hf_tensor_shapes(spec_to_hf_config(spec))).total_bytes
    return spec, weights, FLOAT16_FOLDER
