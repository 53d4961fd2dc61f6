"""From a folder on disk to a model in memory: spec, tokenizer, weights (+ LoRA)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from app.engine.lora import LoraAdapter
from app.engine.models.decoder import DecoderModel
from app.engine.quantized.modules import build_quantized_model, default_backend
from app.engine.tokenizer import Tokenizer
from app.engine.weights import LayerProgress, TensorSource, load_hf_weights, materialize, one_copy_thread
from app.errors import InvalidParameterError, ModelLoadError
from app.formats import checkpoint
from app.formats.spec import ModelSpec

DEFAULT_MAX_CONTEXT = 4096

# On the CPU, fp32 is exact and fast enough for small models; bigger ones halve their RAM in bf16.
_CPU_FP32_MAX_PARAMS = 2_000_000_000


@dataclass
class LoadedModel:
    path: Path
    model_id: str
    spec: ModelSpec
    tokenizer: Tokenizer
    model: DecoderModel
    dtype: torch.dtype


def layer_param_count(spec: ModelSpec) -> int:
    """Weights of the decoder layers' linears (what every token of a prompt multiplies with)."""
    per_layer = (spec.hidden_size * (spec.q_size + 2 * spec.kv_size) + spec.q_size * spec.hidden_size
                 + 3 * spec.hidden_size * spec.intermediate_size)
    return spec.num_layers * per_layer


def param_count(spec: ModelSpec) -> int:
    embeddings = spec.vocab_size * spec.hidden_size * (1 if spec.tie_word_embeddings else 2)
    return layer_param_count(spec) + embeddings


def default_dtype(spec: ModelSpec, device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.float16
    return torch.float32 if param_count(spec) <= _CPU_FP32_MAX_PARAMS else torch.bfloat16


def load_model(path: Path, device: torch.device, *, adapter: str | Path | None = None,
               dtype: torch.dtype | None = None, max_context: int | None = None,
               progress: Callable[[str, int, int], None] | None = None, verify: bool = False) -> LoadedModel:
    """``verify``: hash every file of a checkpoint, even those verified before and unchanged
    since (app.formats.verified); a Hugging Face folder has no recorded hashes to check."""
    if not path.exists():
        raise ModelLoadError(f"{path}: model folder not found")
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a folder (give the model's folder, not a file)")
    if checkpoint.is_checkpoint(path):  # a quantized checkpoint (qwen-tray quantize)
        return load_quantized_model(path, device, adapter=adapter, dtype=dtype, max_context=max_context,
                                    progress=progress, verify=verify)
    spec = ModelSpec.from_hf_folder(path)
    tokenizer = Tokenizer.from_folder(path)
    lora = LoraAdapter(adapter) if adapter else None
    dtype = dtype or default_dtype(spec, device)
    # Build on the meta device, then allocate once on the target: weights are never held twice.
    with torch.device("meta"):
        model = DecoderModel(spec, context_length(spec.max_position_embeddings, max_context)).to(dtype)
    materialize(model, device)
    model.init_rope()
    layers = LayerProgress(spec.num_layers, progress)
    with TensorSource(path) as source, one_copy_thread():
        load_hf_weights(model, source, spec, transform=lora.merge if lora else None, on_tensor=layers.tensor_read)
    layers.finished()
    if lora:
        lora.check_all_used()
    model.eval()
    return LoadedModel(path, path.name, spec, tokenizer, model, dtype)


def load_quantized_model(path: Path, device: torch.device, *, adapter: str | Path | None = None,
                         dtype: torch.dtype | None = None, max_context: int | None = None,
                         progress: Callable[[str, int, int], None] | None = None,
                         backend: str | None = None, verify: bool = False) -> LoadedModel:
    """Load a checkpoint folder (app.formats.checkpoint) into a :class:`LoadedModel`.

    Every file is verified first (size and sha256; ``verify``: hashed even where verified
    before and unchanged since). ``backend`` picks how the quantized
    modules compute (``app.engine.quantized.modules.BACKENDS``; "dense" dequantizes once at
    load, "int4" keeps 4 bits for PyTorch's CPU kernel); default: ``modules.default_backend``.
    """
    path = Path(path)
    if adapter:
        raise ModelLoadError(f"{path}: a quantized checkpoint cannot take a LoRA adapter at load; "
                             "merge it when quantizing (qwen-tray quantize --adapter)")
    manifest = checkpoint.open_checkpoint(path, reuse_verified=not verify)
    tokenizer = Tokenizer.from_folder(path)
    dtype = dtype or default_dtype(manifest.spec, device)
    max_positions = context_length(manifest.spec.max_position_embeddings, max_context)
    weights = ((name, entry.shape, weight) for name, entry, weight in checkpoint.iter_weights(path, manifest))
    with one_copy_thread():
        model = build_quantized_model(manifest.spec, weights, max_positions, device, dtype,
                                      backend=backend or default_backend(device, dtype), progress=progress,
                                      where=str(path / checkpoint.MANIFEST))
    return LoadedModel(path, path.name, manifest.spec, tokenizer, model, dtype)


def context_length(model_max: int, requested: int | None) -> int:
    """Tokens per KV-cache slot: what was asked for, or the model's maximum capped at 4096."""
    if requested is None:
        return min(model_max, DEFAULT_MAX_CONTEXT)
    if requested < 2:
        raise InvalidParameterError("max_context", f"must be >= 2, got {requested}")
    if requested > model_max:
        raise InvalidParameterError("max_context", f"{requested} is more than the model's maximum ({model_max} tokens)")
    return requested
