"""Bits where they matter: a recipe that spends a byte budget by measured sensitivity.

Every decoder layer has four units that can each be 3- or 4-bit: q/k/v (fused, one input),
o_proj, gate/up (fused) and down_proj. For each unit we measure, on the calibration text
streamed through the float model (as the quantizer does), how much output error 3 bits add
over 4 bits:

    gain = (err_3 - err_4) / E||h||^2,   err_b = sum_k E[x_k^2] * sum_n (W - Q_b(W))[n, k]^2

with ``Q_b`` the activation-weighted clipping search at ``b`` bits, ``x`` the unit's input
and ``h`` the residual stream after the layer (the error is added to it, so its size is what
an error is measured against). Units are then given 4 bits in order of gain per extra byte
until the budget -- by default exactly the base recipe's size, so the VRAM plan is unchanged --
is spent; the rest get 3. Tables (embedding, head) keep the base recipe's bits. The result is
an explicit recipe file (every unit named, with the measurements as provenance), so a
quantization from it is reproducible without re-measuring.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from app.engine.tokenizer import Tokenizer
from app.engine.weights import TensorSource
from app.errors import QwenTrayError
from app.formats.checkpoint import write_atomic
from app.formats.core import grouped, padded_k, quantize_groups
from app.formats.recipe import TABLES, Recipe, hf_tensor_shapes, plan_model
from app.formats.spec import ModelSpec
from app.quant import calibration as calib
from app.quant.search import search_scales


@dataclass(frozen=True)
class UnitSensitivity:
    layer: int
    unit: str  # qkv | o | gate_up | down
    modules: tuple[str, ...]  # HF module names
    extra_bytes: int  # what 4 bits cost over 3
    gain: float  # relative output error that 4 bits remove


def _weighted_error(w: torch.Tensor, importance: torch.Tensor, bits: int, device: str) -> float:
    """sum_k c_k sum_n (W - Q(W))^2 with the activation-weighted clipping search at ``bits``."""
    pad = padded_k(w.shape[1]) - w.shape[1]
    wp = F.pad(w.float(), (0, pad)).to(device)
    imp = F.pad(importance.float(), (0, pad)).to(device)
    scales = search_scales(wp, bits, importance=imp, device=device)
    wg = grouped(wp)
    deq = quantize_groups(wg, scales.to(device), bits).float() * scales.to(device).float().unsqueeze(-1)
    return float(((deq - wg).square().reshape(wp.shape) * imp).sum())


def measure(model: Path, calibration_text: Path | None = None,
            tokens: int = calib.DEFAULT_CALIBRATION_TOKENS, device: str = "cpu",
            progress: Callable[[int, int], None] | None = None) -> list[UnitSensitivity]:
    """The sensitivity of every unit of every layer of the HF folder ``model``."""
    spec = ModelSpec.from_hf_folder(model)
    ids = calib.calibration_ids(Tokenizer.from_folder(model), calibration_text, tokens, spec.vocab_size)
    with TensorSource(model) as source:
        embedding = source.get("model.embed_tokens.weight")
        state = calib.Calibration(spec, embedding[torch.tensor(ids)].float())
        del embedding
        out = []
        for i in range(spec.num_layers):
            prefix = f"model.layers.{i}."
            tensors = {name: source.get(name) for name in source.names() if name.startswith(prefix)}
            stats = state.run_layer(i, tensors).stats
            residual = float(state.hidden.square().sum(dim=-1).mean())
            for unit, modules in calib.INPUTS.items():
                names = [f"{prefix}{m}" for m in modules]
                importance = stats[unit].mean_sq
                errors = {b: sum(_weighted_error(tensors[f"{n}.weight"], importance, b, device) for n in names)
                          for b in (3, 4)}
                extra = sum(tensors[f"{n}.weight"].shape[0] * padded_k(tensors[f"{n}.weight"].shape[1]) // 8
                            for n in names)
                out.append(UnitSensitivity(i, unit, tuple(names), extra, (errors[3] - errors[4]) / residual))
            if progress is not None:
                progress(i + 1, spec.num_layers)
    return out


def stored_shapes(shapes: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """Shapes as a checkpoint stores them: K of every 2-D weight zero-padded to whole groups."""
    return [(n, (s[0], padded_k(s[1])) if len(s) == 2 else s) for n, s in shapes]


def allocate(units: list[UnitSensitivity], base: Recipe, shapes: list[tuple[str, tuple[int, ...]]],
             budget_bytes: int | None = None, name: str | None = None) -> tuple[Recipe, dict]:
    """Give 4 bits to the units with the most gain per byte within ``budget_bytes`` (default:
    the base recipe's size); return the explicit recipe and a summary for its provenance."""
    # Sizes as stored: K zero-padded to whole groups (hidden sizes like 576 or 64 are not multiples of 128).
    shapes = stored_shapes(shapes)
    budget = budget_bytes if budget_bytes is not None else plan_model(base, shapes).total_bytes
    all3 = Recipe("all3", tuple((m, 3) for u in units for m in u.modules) + base.rules, base.default_bits)
    spent = plan_model(all3, shapes).total_bytes
    if spent > budget:
        raise QwenTrayError(f"a budget of {budget / 2**30:.3f} GiB is below the all-3-bit size "
                            f"{spent / 2**30:.3f} GiB of recipe {base.name}")
    upgraded = set()
    for unit in sorted(units, key=lambda u: u.gain / u.extra_bytes, reverse=True):
        if spent + unit.extra_bytes <= budget:
            upgraded.add((unit.layer, unit.unit))
            spent += unit.extra_bytes
    rules = tuple((m, 4 if (u.layer, u.unit) in upgraded else 3) for u in units for m in u.modules)
    tables = tuple((t, base.bits_for(t)) for t in TABLES)
    recipe = Recipe(name or f"{base.name}-sensitive", rules + tables, base.default_bits)
    summary = {"base": base.name, "budget_bytes": budget, "total_bytes": spent,
               "units_at_4_bits": len(upgraded), "units": len(units),
               "gains": {f"{u.layer}.{u.unit}": round(u.gain, 8) for u in units}}
    return recipe, summary


def write_recipe(path: Path, recipe: Recipe, provenance: dict) -> None:
    """The recipe as JSON (written atomically): ``qwen-tray quantize --recipe PATH`` reads it back."""
    if path.suffix.lower() != ".json":
        raise QwenTrayError(f"{path}: a measured recipe is written as .json")
    write_atomic(path, (json.dumps(recipe.to_data(provenance), indent=1) + "\n").encode("utf-8"))


def model_shapes(model: Path) -> list[tuple[str, tuple[int, ...]]]:
    config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    return hf_tensor_shapes(config)
