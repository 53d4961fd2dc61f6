"""A model as shapes first, its weights streamed in later: the GPU load's host-memory diet.

:func:`load_skeleton` builds the model of a folder (Hugging Face layout) or a quantized
checkpoint on the meta device, from config.json or the manifest alone: every parameter and
buffer has its shape and dtype and no memory. The CUDA runtime plans the VRAM from those
shapes, gives every tensor its place in one device allocation (app.engine.cuda.weights
``module_to_arena``), then calls :meth:`Skeleton.fill`, which reads each tensor from its
memory-mapped file and copies it into its place. The host holds one tensor at a time (and
the page cache of the file being read), never the model: a 3B checkpoint no longer passes
through 1.5 GB of host memory on its way to the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from app.engine.loading import LoadedModel, context_length
from app.engine.lora import LoraAdapter
from app.engine.models.decoder import DecoderModel
from app.engine.quantized.modules import QuantLinear, WeightItem, build_quantized_model
from app.engine.tokenizer import Tokenizer
from app.engine.weights import (
    LayerProgress,
    Target,
    TensorSource,
    hf_weight_map,
    load_hf_weights,
)
from app.errors import ModelLoadError
from app.formats import checkpoint
from app.formats.spec import ModelSpec
from app.formats.tensor import QuantizedTensor

META = torch.device("meta")
Progress = Callable[[str, int, int], None]


@dataclass
class Skeleton:
    """A model on the meta device and where its weights are (``fill`` copies them in)."""

    loaded: LoadedModel  # loaded.model: every tensor on the meta device until placed
    manifest: checkpoint.Manifest | None  # a quantized checkpoint's, None for a folder
    adapter: LoraAdapter | None = None

    def fill(self, progress: Progress | None = None) -> None:
        """Copy every weight from its file into the model's tensors (placed by then: on a
        device, not meta), then compute the RoPE tables."""
        model = self.loaded.model
        if any(t.is_meta for t in _tensors(model)):
            raise RuntimeError("place the skeleton's tensors before filling them (module_to_arena)")
        layers = LayerProgress(self.loaded.spec.num_layers, progress)
        if self.manifest is None:
            with TensorSource(self.loaded.path) as source:
                load_hf_weights(model, source, self.loaded.spec, transform=self.adapter.merge if self.adapter else None,
                                on_tensor=layers.tensor_read)
            if self.adapter:
                self.adapter.check_all_used()
        else:
            _fill_from_checkpoint(model, self.loaded.path, self.manifest, layers)
        layers.finished()
        model.init_rope()


def load_skeleton(path: Path, *, adapter: str | Path | None = None, max_context: int | None = None,
                  dtype: torch.dtype = torch.float16, verify: bool = False) -> Skeleton:
    """The model of ``path`` on the meta device (a checkpoint's files are verified first;
    ``verify``: hashed even where verified before and unchanged)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"{path}: model folder not found" if not path.exists() else
                             f"{path}: not a folder (give the model's folder, not a file)")
    if checkpoint.is_checkpoint(path):
        if adapter:
            raise ModelLoadError(f"{path}: a quantized checkpoint cannot take a LoRA adapter at load; "
                                 "merge it when quantizing (qwen-tray quantize --adapter)")
        manifest = checkpoint.open_checkpoint(path, reuse_verified=not verify)
        spec = manifest.spec
        positions = context_length(spec.max_position_embeddings, max_context)
        model = build_quantized_model(spec, _meta_weights(manifest), positions, META, dtype,
                                      backend="packed", where=str(path / checkpoint.MANIFEST))
    else:
        manifest = None
        spec = ModelSpec.from_hf_folder(path)
        with META:
            model = DecoderModel(spec, context_length(spec.max_position_embeddings, max_context)).to(dtype)
    lora = LoraAdapter(adapter) if adapter else None
    loaded = LoadedModel(path, path.name, spec, Tokenizer.from_folder(path), model, dtype)
    return Skeleton(loaded, manifest, lora)


def _meta_weights(manifest: checkpoint.Manifest) -> Iterator[WeightItem]:
    """Every tensor of the manifest with its shape and dtype, no data."""
    for name, entry in manifest.tensors.items():
        if entry.format == checkpoint.FP16:
            yield name, entry.shape, torch.empty(entry.shape, dtype=torch.float16, device=META)
            continue
        n, k = entry.shape[0], entry.stored_k
        tensors = {key: torch.empty(shape, dtype=dtype, device=META)
                   for key, (shape, dtype) in QuantizedTensor.expected_shapes(entry.format, n, k).items()}
        yield name, entry.shape, QuantizedTensor(entry.format, (n, k), tensors, name=name.removesuffix(".weight"))


def _fill_from_checkpoint(model: torch.nn.Module, folder: Path, manifest: checkpoint.Manifest,
                          layers: LayerProgress) -> None:
    """Each checkpoint tensor (checked against the manifest by iter_weights) into its rows of the
    model's (fused) tensor: q/k/v and gate/up parts land at their row offsets."""
    targets = hf_weight_map(manifest.spec)
    params = dict(model.named_parameters())
    for name, _, weight in checkpoint.iter_weights(folder, manifest):
        target = targets[name]  # build_quantized_model refused a manifest of other tensors
        if isinstance(weight, QuantizedTensor):
            module = model.get_submodule(target.param.removesuffix(".weight"))
            assert isinstance(module, QuantLinear)
            for key, tensor in weight.tensors.items():
                _rows(getattr(module, key), target, tensor.shape[0]).copy_(tensor)
        else:
            _rows(params[target.param], target, weight.shape[0]).copy_(weight)
        layers.tensor_read(name)


def _rows(dest: torch.Tensor, target: Target, rows: int) -> torch.Tensor:
    return dest.data[target.row_offset:target.row_offset + rows]


def _tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            yield from (t for t in store.values() if t is not None)
