"""Bits where they matter: a recipe that spends a byte budget by measured sensitivity.

Every decoder layer has four units that can each be 3- or 4-bit: q/k/v (fused, one input),
o_proj, gate/up (fused) and down_proj. For each unit we measure, on the calibration text
streamed through the float model (as the quantizer does), how much output error 3 bits add
over 4 bits:

    gain = (err_3 - err_4) / E||h||^2,   err_b = E||(W - Q_b(W)) x||^2

with ``x`` the unit's input, ``h`` the residual stream after the layer (the error is added to
it, so its size is what an error is measured against) and ``Q_b`` the method that will
quantize the model at ``b`` bits: GPTQ (the default; the full input covariance, as GPTQ
minimises it) or the activation-weighted clipping search of ``calibrated`` (its diagonal,
``sum_k E[x_k^2] sum_n (W - Q_b)[n, k]^2``). Which units lose most depends on the method:
GPTQ compensates rounding error that the clipping search leaves in place. Units are then given
4 bits in order of gain per extra byte until the budget -- by default exactly the base
recipe's size, so the VRAM plan is unchanged -- is spent; the rest get 3. Tables (embedding,
head) keep the base recipe's bits. The result is an explicit recipe file (every unit named,
with the measurements as provenance), so a quantization from it is reproducible without
re-measuring.
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
from app.formats.core import GROUP_SIZE, grouped, padded_k, quantize_groups
from app.formats.recipe import TABLES, Recipe, hf_tensor_shapes, plan_model
from app.formats.spec import ModelSpec
from app.quant import calibration as calib
from app.quant.gptq import GptqSolver
from app.quant.methods import DEFAULT_METHOD, SENSITIVITY_METHODS
from app.quant.quantizer import GPTQ_CALIBRATION_WINDOW, GPTQ_SETTINGS
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


def _gptq_errors(weights: list[torch.Tensor], hessian: torch.Tensor, name: str, device: str) -> dict[int, float]:
    """``E||(W - Q_b(W)) x||^2`` summed over ``weights`` (which share the input whose Hessian
    ``2 E[x x^T]`` is given), with ``Q_b`` GPTQ as the quantizer runs it, for b = 3 and 4."""
    pad = padded_k(hessian.shape[0]) - hessian.shape[0]
    h = F.pad(hessian.float(), (0, pad, 0, pad)).to(device)  # padded inputs are zero: dead channels
    solver = GptqSolver(h, GPTQ_SETTINGS, name=name, device=device)  # h itself is kept for the error
    errors = {}
    for bits in (3, 4):
        total = 0.0
        for w in weights:
            wp = F.pad(w.float(), (0, pad)).to(device)
            q, scales = solver.quantize_int(wp, bits, name=name)
            diff = wp - q.float() * scales.float().repeat_interleave(GROUP_SIZE, dim=1)
            total += float(((diff @ h) * diff).sum()) / 2
        errors[bits] = total
    return errors


def measure(model: Path, calibration_text: Path | None = None,
            tokens: int = calib.DEFAULT_CALIBRATION_TOKENS, device: str = "cpu",
            progress: Callable[[int, int], None] | None = None, method: str = DEFAULT_METHOD) -> list[UnitSensitivity]:
    """The sensitivity of every unit of every layer of the HF folder ``model``, for ``method``."""
    if method not in SENSITIVITY_METHODS:
        raise QwenTrayError(f"sensitivity is measured for {' or '.join(SENSITIVITY_METHODS)}, not {method!r}")
    gptq = method == "gptq"
    spec = ModelSpec.from_hf_folder(model)
    ids = calib.calibration_ids(Tokenizer.from_folder(model), calibration_text, tokens, spec.vocab_size)
    with TensorSource(model) as source:
        embedding = source.get("model.embed_tokens.weight")
        state = calib.Calibration(spec, embedding[torch.tensor(ids)].float(), GPTQ_CALIBRATION_WINDOW if gptq else None)
        del embedding
        out = []
        for i in range(spec.num_layers):
            prefix = f"model.layers.{i}."
            tensors = {name: source.get(name) for name in source.names() if name.startswith(prefix)}
            calibrated = state.run_layer(i, tensors, device if gptq else None)
            residual = float(state.hidden.square().sum(dim=-1).mean())
            for unit, modules in calib.INPUTS.items():
                names = [f"{prefix}{m}" for m in modules]
                if gptq:
                    errors = _gptq_errors([tensors[f"{n}.weight"] for n in names], calibrated.hessians.pop(unit),
                                          names[0], device)
                else:
                    importance = calibrated.stats[unit].mean_sq
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


def _all_3_bit(base: Recipe) -> Recipe:
    """Every unit's weights at 3 bits, the tables as ``base`` has them: the smallest allocation."""
    units = tuple((f"model.layers.*.{m}", 3) for modules in calib.INPUTS.values() for m in modules)
    return Recipe("all3", units + base.rules, base.default_bits)


def check_budget(base: Recipe, shapes: list[tuple[str, tuple[int, ...]]], budget_bytes: int | None) -> int:
    """The budget in bytes (default: ``base``'s size), refused when even all-3-bit units exceed it:
    known from the shapes, so said before the measurement (hours on a 7B on the CPU) starts."""
    shapes = stored_shapes(shapes)
    budget = budget_bytes if budget_bytes is not None else plan_model(base, shapes).total_bytes
    smallest = plan_model(_all_3_bit(base), shapes).total_bytes
    if smallest > budget:
        raise QwenTrayError(f"a budget of {budget / 2**30:.3f} GiB is below the all-3-bit size "
                            f"{smallest / 2**30:.3f} GiB of recipe {base.name}")
    return budget


def allocate(units: list[UnitSensitivity], base: Recipe, shapes: list[tuple[str, tuple[int, ...]]],
             budget_bytes: int | None = None, name: str | None = None) -> tuple[Recipe, dict]:
    """Give 4 bits to the units with the most gain per byte within ``budget_bytes`` (default:
    the base recipe's size); return the explicit recipe and a summary for its provenance."""
    # Sizes as stored: K zero-padded to whole groups (hidden sizes like 576 or 64 are not multiples of 128).
    shapes = stored_shapes(shapes)
    budget = check_budget(base, shapes, budget_bytes)
    spent = plan_model(_all_3_bit(base), shapes).total_bytes
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
