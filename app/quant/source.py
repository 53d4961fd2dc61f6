"""Reading the source of a quantization: a Hugging Face folder's tensor shapes, its embedding /
``lm_head`` tables in row chunks, the LoRA adapter merged into it, and the files copied as they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from app.engine.lora import LoraAdapter
from app.engine.weights import hf_weight_map
from app.errors import ModelLoadError, QwenTrayError, UnsupportedModelError
from app.formats.checkpoint import COPIED_FILES
from app.formats.core import row_chunks
from app.formats.recipe import hf_tensor_shapes
from app.formats.spec import ModelSpec

# Rows of the embedding / lm_head read from the source at once (~4 M values: 16 MiB in fp32).
TABLE_CHUNK_ELEMENTS = 1 << 22


def to_fp16(name: str, t: torch.Tensor) -> torch.Tensor:
    t16 = t.to(torch.float16)
    if not bool(torch.isfinite(t16).all()):
        raise QwenTrayError(f"{name}: values are NaN/Inf or exceed the fp16 range (norms and biases are kept fp16)")
    return t16


def table_chunks(folder: Path, name: str, shape: tuple[int, int]):
    """Yield (row slice, rows of ``name``) without reading the whole table.

    The file is reopened for every chunk: pages read through one mapping stay resident
    until it is dropped, which would grow RSS by the whole table (622 MB for Qwen2.5-3B).
    """
    path = str(file_of(folder, name))
    for rows in row_chunks(shape[0], shape[1], TABLE_CHUNK_ELEMENTS):
        with safe_open(path, framework="pt") as handle:
            chunk = handle.get_slice(name)[rows.start:rows.stop]
        yield rows, chunk


def file_of(folder: Path, name: str) -> Path:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return folder / json.loads(index.read_text(encoding="utf-8"))["weight_map"][name]
    return folder / "model.safetensors"


def expected_shapes(folder: Path, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, from config.json, with the biases the spec says the model has."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["model_type"] = "qwen2" if spec.attention_bias else "llama"  # hf_tensor_shapes reads q/k/v bias from it
    config["attention_bias"] = spec.attention_bias and spec.architecture != "Qwen2ForCausalLM"
    shapes = dict(hf_tensor_shapes(config))
    differ = sorted(set(shapes) ^ set(hf_weight_map(spec)))
    if differ:  # e.g. an o_proj bias (Llama attention_bias), which the engine does not support
        raise UnsupportedModelError(f"{folder / 'config.json'}: tensors {', '.join(differ[:3])} are not supported")
    return shapes


def open_adapter(path: Path | None, shapes: dict) -> LoraAdapter | None:
    if path is None:
        return None
    adapter = LoraAdapter(path)
    modules = {n.removesuffix(".weight") for n in shapes if n.endswith(".weight")}
    unknown = sorted(set(adapter.pairs) - modules)
    if unknown:
        raise ModelLoadError(f"{adapter.weights_path}: LoRA modules not found in the base model: {', '.join(unknown[:3])}")
    return adapter


def copy_side_files(src: Path, out: Path) -> list[str]:
    copied = []
    for name in COPIED_FILES:
        if (src / name).is_file():
            tmp = out / f".{name}.tmp"
            shutil.copyfile(src / name, tmp)
            tmp.replace(out / name)
            copied.append(name)
    return copied
