"""Reading Hugging Face safetensors (single file or sharded) into a DecoderModel.

Tensors are read one at a time through ``safe_open`` (memory-mapped), converted to the
compute dtype and copied into their (possibly fused) parameter, so a model is never held
twice in memory. Loading reports missing and leftover tensors by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from app.errors import ModelLoadError
from app.formats.spec import ModelSpec
from app.progress import LAYERS_STAGE

_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.")
# Tensors a checkpoint may carry that the model recomputes (rotary tables).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSource:
    """Name → tensor over ``model.safetensors`` or a ``model.safetensors.index.json`` shard set."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._files: dict[str, Path] = self._index()
        self._stack = ExitStack()
        self._handles: dict[Path, object] = {}

    def _index(self) -> dict[str, Path]:
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ModelLoadError(f"{index}: not a valid safetensors index ({e})") from None
            files = {name: self.folder / shard for name, shard in weight_map.items()}
            for shard in sorted(set(files.values())):
                if not shard.is_file():
                    raise ModelLoadError(f"{shard}: shard listed in {index.name} is missing")
            return files
        if single.is_file():
            names = self._open(single).keys()
            return {name: single for name in names}
        raise ModelLoadError(f"{self.folder}: no model.safetensors or model.safetensors.index.json")

    def _open(self, path: Path):
        try:  # safetensors says "No such file or directory" for a file it may not read: ask the OS first
            path.open("rb").close()
        except OSError as e:
            raise ModelLoadError(f"{path}: cannot read safetensors file ({e.strerror or e}); check its "
                                 "permissions") from None
        try:
            return safe_open(str(path), framework="pt")
        except (SafetensorError, OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot read safetensors file ({e})") from None

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()

    def names(self) -> list[str]:
        return list(self._files)

    def check_headers(self) -> None:
        """Open every file's header (ModelLoadError for a corrupt or truncated one); no tensor is read."""
        for path in sorted(set(self._files.values())):
            if path not in self._handles:
                self._handles[path] = self._open(path)

    def get(self, name: str) -> torch.Tensor:
        path = self._files[name]
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = self._open(path)
        try:
            return handle.get_tensor(name)
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ModelLoadError(f"{path}: tensor {name!r} is unreadable ({e})") from None


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Give every parameter and buffer still on the meta device fresh memory of its dtype on
    ``device`` (uninitialized: the weights are copied in next). Not ``Module.to_empty``: its
    meta path (``empty_like`` of a meta tensor) imports torch.fx's symbolic shapes and sympy,
    seconds of start-up."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                module._parameters[name] = torch.nn.Parameter(_empty(p, device), requires_grad=False)
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_meta:
                module._buffers[name] = _empty(b, device)


@contextmanager
def one_copy_thread() -> Iterator[None]:
    """Read weights in with one CPU thread. Copies and repacking are bound by memory, not
    arithmetic, and PyTorch's parallel ops keep their OpenMP workers spinning between tensors: on
    a machine whose cores are busy with other work (a desktop; the 2 shared cores of our test
    machine) that made loads two to five times slower than one thread (benchmarks/bench_startup.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _empty(like: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty(like.shape, dtype=like.dtype, device=device)


@dataclass(frozen=True, slots=True)
class Target:
    """Where one HF tensor goes: a parameter name and the row offset inside a fused matrix."""

    param: str
    row_offset: int = 0


def hf_weight_map(spec: ModelSpec) -> dict[str, Target]:
    """HF tensor name → our parameter (q/k/v fused into qkv_proj, gate/up into gate_up_proj)."""
    m: dict[str, Target] = {"model.embed_tokens.weight": Target("embed_tokens"), "model.norm.weight": Target("norm.weight")}
    if not spec.tie_word_embeddings:
        m["lm_head.weight"] = Target("lm_head.weight")
    q, kv, inter = spec.q_size, spec.kv_size, spec.intermediate_size
    for i in range(spec.num_layers):
        hf, ours = f"model.layers.{i}", f"layers.{i}"
        m[f"{hf}.input_layernorm.weight"] = Target(f"{ours}.input_layernorm.weight")
        m[f"{hf}.post_attention_layernorm.weight"] = Target(f"{ours}.post_attention_layernorm.weight")
        kinds = ["weight", "bias"] if spec.attention_bias else ["weight"]
        for kind in kinds:
            for proj, offset in (("q_proj", 0), ("k_proj", q), ("v_proj", q + kv)):
                m[f"{hf}.self_attn.{proj}.{kind}"] = Target(f"{ours}.self_attn.qkv_proj.{kind}", offset)
        m[f"{hf}.self_attn.o_proj.weight"] = Target(f"{ours}.self_attn.o_proj.weight")
        mlp_kinds = ["weight", "bias"] if spec.mlp_bias else ["weight"]
        for kind in mlp_kinds:
            m[f"{hf}.mlp.gate_proj.{kind}"] = Target(f"{ours}.mlp.gate_up_proj.{kind}", 0)
            m[f"{hf}.mlp.up_proj.{kind}"] = Target(f"{ours}.mlp.gate_up_proj.{kind}", inter)
            m[f"{hf}.mlp.down_proj.{kind}"] = Target(f"{ours}.mlp.down_proj.{kind}")
    return m


TensorTransform = Callable[[str, torch.Tensor], torch.Tensor]


def load_hf_weights(model: torch.nn.Module, source: TensorSource, spec: ModelSpec,
                    transform: TensorTransform | None = None,
                    on_tensor: Callable[[str], None] | None = None) -> None:
    """Copy every expected tensor of ``source`` into ``model``'s parameters.

    ``transform(name, tensor)`` may rewrite a tensor first (LoRA merge); ``on_tensor(name)``
    is told each tensor copied (:class:`LayerProgress`). Raises ModelLoadError naming missing
    tensors, unexpected ones and shape mismatches.
    """
    params = dict(model.named_parameters())
    plan = hf_weight_map(spec)
    check_tensor_names(source, set(plan), spec)
    for name, target in plan.items():
        tensor = source.get(name)
        if transform is not None:
            tensor = transform(name, tensor)
        _copy_into(params[target.param], tensor, target, name, source.folder)
        if on_tensor is not None:
            on_tensor(name)


class LayerProgress:
    """``progress("layers", done, total)`` from the names of the tensors read, which come layer
    by layer: a layer counts as done once a tensor of a later one is read (or at the end)."""

    def __init__(self, num_layers: int, progress: Callable[[str, int, int], None] | None):
        self.num_layers, self.progress = num_layers, progress
        self.done = 0

    def tensor_read(self, name: str) -> None:
        match = _LAYER_NAME.match(name)
        if match and int(match.group(1)) > self.done and self.progress is not None:
            self.done = min(int(match.group(1)), self.num_layers)
            self.progress(LAYERS_STAGE, self.done, self.num_layers)

    def finished(self) -> None:
        self.done = self.num_layers
        if self.progress is not None:
            self.progress(LAYERS_STAGE, self.num_layers, self.num_layers)


def check_tensor_names(source: TensorSource, expected: set[str], spec: ModelSpec) -> None:
    """Refuse a checkpoint that lacks an expected tensor or carries ones the model does not have."""
    available = set(source.names())
    missing = sorted(expected - available)
    if missing:
        raise ModelLoadError(f"{source.folder}: missing tensors {_short(missing)}")
    leftover = sorted(n for n in available - expected if not n.endswith(_IGNORED_SUFFIXES)
                      and not (spec.tie_word_embeddings and n == "lm_head.weight"))
    if leftover:
        raise ModelLoadError(f"{source.folder}: unexpected tensors {_short(leftover)} (not a {spec.architecture}?)")


def _copy_into(param: torch.Tensor, tensor: torch.Tensor, target: Target, name: str, folder: Path) -> None:
    rows = tensor.shape[0]
    dest = param.data[target.row_offset:target.row_offset + rows]
    if dest.shape != tensor.shape:
        raise ModelLoadError(
            f"{folder}: tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)} from config.json")
    dest.copy_(tensor)  # converts to the parameter's dtype in the same pass: no temporary


def _short(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")

