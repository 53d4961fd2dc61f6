"""The grid control of benchmarks/quality.py: our methods fake-quantized at llama.cpp's group width.

The starter model's weights were dequantized from 32-wide llama.cpp blocks, which favours
32-wide formats. Here every 2-D weight (the tied embedding/head included) is quantized by our
methods to 4-bit symmetric groups of 32 with an fp16 scale -- exactly Q4_0's grid and its 4.5
bits/weight -- and written back as a plain Hugging Face folder (no kernel runs 32-wide groups;
this is for quality only). Beside llama.cpp's ``Q4_0 --pure`` it compares method with method on
one grid; beside our 128-wide checkpoints it shows what the group width costs.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from app.engine.tokenizer import Tokenizer
from app.formats.core import qrange
from app.formats.spec import ModelSpec
from app.quant import calibration as calib
from app.quant.gptq import GptqSettings, GptqSolver, group_scales

CONTROL_METHODS = ("rtn", "calibrated", "gptq")


def _dequantized(q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    n, k = q.shape
    return (q.float().reshape(n, k // group, group) * scales.float().unsqueeze(-1)).reshape(n, k)


def fake_quantize(w: torch.Tensor, bits: int, group: int, method: str, importance: torch.Tensor | None,
                  hessian: torch.Tensor | None, name: str, gptq: GptqSettings = GptqSettings()) -> torch.Tensor:
    """W [N, K] -> its quantize-dequantize under ``method`` with ``group``-wide fp16-scaled groups."""
    w = w.float()
    if method == "gptq" and hessian is not None:
        solver = GptqSolver(hessian, dataclasses.replace(gptq, group_size=group), name=name)
        q, scales = solver.quantize_int(w, bits, name=name)
        return _dequantized(q, scales, group)
    how = "rtn" if method == "rtn" else "search"
    imp = importance if importance is not None and how == "search" else torch.ones(w.shape[1])
    scales = group_scales(w, bits, imp, how, name, group)
    qmin, qmax = qrange(bits)
    n, k = w.shape
    q = torch.round(w.reshape(n, k // group, group) / scales.float().unsqueeze(-1)).clamp_(qmin, qmax)
    return (q * scales.float().unsqueeze(-1)).reshape(n, k)


def dithered_folder(source: Path, out: Path, seed: int, block: int = 32) -> Path:
    """A copy of ``source`` whose decoder-layer weights are moved off their 4-bit grid.

    S was dequantized from Q4_1: every 32-wide block of a row holds at most 16 levels
    ``min + d * k`` with ``d = (max - min) / 15``. Adding noise uniform in ``[-d/2, d/2)`` spreads
    each weight over its rounding cell -- the error Q4_1 made, in reverse -- so the weights are
    continuous again, as an original float model's would be, at the same scale as S's.
    """
    weights = load_file(str(source / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    result = dict(weights)
    for name, w in weights.items():
        if ".layers." not in name or w.dim() != 2 or w.shape[1] % block:
            continue
        blocks = w.float().reshape(-1, block)
        step = (blocks.amax(1, keepdim=True) - blocks.amin(1, keepdim=True)) / 15
        noise = (torch.rand(blocks.shape, generator=generator) - 0.5) * step
        result[name] = (blocks + noise).reshape(w.shape).to(w.dtype)
    return _write_folder(source, out, result)


def control_folder(source: Path, out: Path, method: str, bits: int = 4, group: int = 32,
                   calibration_tokens: int = calib.DEFAULT_CALIBRATION_TOKENS, gptq: GptqSettings = GptqSettings(),
                   calibration: Path | None = None, window: int | None = None) -> Path:
    """Fake-quantize every 2-D weight of the HF folder ``source`` into a new HF folder ``out``."""
    if gptq.sequential:
        raise ValueError("the control calibrates on the float model only (no sequential GPTQ)")
    spec = ModelSpec.from_hf_folder(source)
    weights = load_file(str(source / "model.safetensors"))
    tokenizer = Tokenizer.from_folder(source)
    ids = calib.calibration_ids(tokenizer, calibration, calibration_tokens, spec.vocab_size)
    calibration = calib.Calibration(spec, weights["model.embed_tokens.weight"][torch.tensor(ids)].float(), window)
    result = dict(weights)
    for i in range(spec.num_layers):
        prefix = f"model.layers.{i}."
        tensors = {n: t for n, t in weights.items() if n.startswith(prefix)}
        layer = calibration.run_layer(i, tensors, "cpu" if method == "gptq" else None)
        for key, modules in calib.INPUTS.items():
            for module in modules:
                name = f"{prefix}{module}.weight"
                result[name] = fake_quantize(tensors[name], bits, group, method, layer.stats[key].mean_sq,
                                             layer.hessians.get(key), name, gptq).to(weights[name].dtype)
    norm = weights["model.norm.weight"]
    head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    head_importance = calibration.head_stats(norm, spec.rms_norm_eps).mean_sq
    head_hessian = calibration.head_hessian(norm, spec.rms_norm_eps, "cpu") if head == "lm_head.weight" else None
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in weights:  # a tied table is searched, not GPTQ'd (as the quantizer does)
            is_head = name == head
            table_method = method if is_head or method != "gptq" else "calibrated"
            result[name] = fake_quantize(weights[name], bits, group, table_method,
                                         head_importance if is_head else None,
                                         head_hessian if is_head else None, name, gptq).to(weights[name].dtype)
    return _write_folder(source, out, result)


def _write_folder(source: Path, out: Path, weights: dict[str, torch.Tensor]) -> Path:
    """An HF folder ``out``: ``weights`` as its safetensors, beside ``source``'s JSON files."""
    out.mkdir(parents=True)
    save_file({n: t.contiguous() for n, t in weights.items()}, str(out / "model.safetensors"))
    for path in source.iterdir():
        if path.suffix == ".json":
            shutil.copy(path, out / path.name)
    return out
