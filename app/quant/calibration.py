"""Calibration for the ``calibrated``, ``awq`` and ``gptq`` methods, layer by layer, while streaming.

The hidden states of a calibration text (default: the first 2048 tokens of the mixed English /
Chinese prose shipped in ``app/resources/text/calibration.txt``; never the held-out texts the
quality is measured on) are carried through the float decoder layers one at a time, exactly as
the quantizer streams them. For each layer we record the per-channel statistics of the inputs
of qkv_proj, o_proj, gate_up_proj and down_proj (and, after the last layer, of the head):

- ``calibrated``: every quantized weight's clipping search weighs its error by E[x^2] of its
  input channels (:func:`activation_importance`), so the search stops clipping the columns
  that carry large activations.
- ``awq`` additionally rescales columns (:func:`apply_awq`): q/k/v and gate/up get AWQ
  scales folded into the RMSNorm before them, down_proj's go into up_proj's rows; o_proj is
  not rescaled (its input is v_proj's output, shared by several heads under GQA).
- ``gptq`` also accumulates each input's Hessian ``2 X^T X`` (:class:`app.quant.gptq.HessianProbe`)
  on the quantizer's device, for the error-compensating pass of :mod:`app.quant.gptq`.

The hidden states move on through the *float* layer, so the statistics of layer i never
depend on how earlier layers were quantized, and a resumed run recomputes them exactly --
unless GPTQ runs ``sequential``: then the quantizer moves them on through each layer as it
was quantized (:meth:`Calibration.redo_layer`), and a resume replays the written layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from app.engine.layers import DecoderLayer, RMSNorm, rope_tables
from app.engine.weights import hf_weight_map
from app.errors import QwenTrayError
from app.formats.core import padded_k
from app.formats.recipe import Recipe
from app.formats.spec import ModelSpec
from app.quant.awq import (
    ActivationStats,
    awq_search,
    fold_into_norm,
    fold_into_previous_linear,
    scale_weight_columns,
    scaled_importance,
)
from app.quant.gptq import HessianProbe

# GPTQ's Hessian has rank <= tokens: 2048 covers Qwen2.5-3B's hidden size (2048) and most of the 7B's.
DEFAULT_CALIBRATION_TOKENS = 2048
MAX_CALIBRATION_TOKENS = 4096
# alpha in {0, 0.1, ..., 1}: as good as steps of 0.05 on the starter model (docs/results/quality.md), half the time.
AWQ_ALPHA_STEPS = 10
# The inputs whose statistics a layer records (module path inside a DecoderLayer).
_PROBES = {"qkv": "self_attn.qkv_proj", "o": "self_attn.o_proj", "gate_up": "mlp.gate_up_proj",
           "down": "mlp.down_proj"}


def default_calibration_file() -> Path:
    """The calibration text shipped with the app (mixed English / Chinese prose, CC0)."""
    path = Path(__file__).resolve().parent.parent / "resources" / "text" / "calibration.txt"
    if not path.is_file():
        raise QwenTrayError(f"no calibration text: {path} not found; pass --calibration FILE")
    return path


def calibration_ids(tokenizer, path: Path | None, tokens: int, vocab_size: int) -> list[int]:
    """The first ``tokens`` token ids of the calibration text."""
    path = path or default_calibration_file()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise QwenTrayError(f"{path}: cannot read the calibration text ({e})") from None
    ids = tokenizer.encode(text)[:tokens]
    if ids and max(ids) >= vocab_size:
        raise QwenTrayError(f"{tokenizer.source}: token id {max(ids)} of the calibration text is outside the "
                            f"model's vocabulary ({vocab_size}); does the tokenizer belong to this model?")
    if len(ids) < 16:
        raise QwenTrayError(f"{path}: the calibration text has only {len(ids)} tokens (need at least 16)")
    return ids


class _OneSequenceCache:
    """Stands in for the KV cache: one whole sequence at position 0, nothing kept."""

    def append(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor):
        return k.transpose(0, 1), v.transpose(0, 1)  # [T, Hkv, D] -> [Hkv, T, D]


class _StatsProbe:
    """Sums of |x| and x^2 per input channel, fed by a forward pre-hook."""

    def __init__(self):
        self.abs_sum = self.sq_sum = None
        self.count = 0

    def __call__(self, module, args) -> None:
        x = args[0].reshape(-1, args[0].shape[-1])  # [tokens, K]
        abs_sum = x.abs().sum(0, dtype=torch.float64)  # fp64 sums, no fp64 copy of x
        sq_sum = x.square().sum(0, dtype=torch.float64)
        self.abs_sum = abs_sum if self.abs_sum is None else self.abs_sum + abs_sum
        self.sq_sum = sq_sum if self.sq_sum is None else self.sq_sum + sq_sum
        self.count += x.shape[0]

    def stats(self, name: str) -> ActivationStats:
        return ActivationStats((self.abs_sum / self.count).float(), (self.sq_sum / self.count).float(), name=name)


@dataclass
class LayerCalibration:
    """What one layer's calibration pass recorded, by probe key (qkv, o, gate_up, down)."""

    stats: dict[str, ActivationStats]
    hessians: dict[str, torch.Tensor] = field(default_factory=dict)  # only when asked for (gptq)


class Calibration:
    """Hidden states [T, hidden] of the calibration tokens at the input of layer ``next_layer``.

    ``window``: the tokens are cut into sequences of this many, each attending from position 0
    (as the held-out evaluation and llama.cpp's imatrix read text); None: one sequence.
    """

    def __init__(self, spec: ModelSpec, hidden: torch.Tensor, window: int | None = None):
        self.spec = spec
        self.hidden = hidden.float()
        self.next_layer = 0
        self.window = window or hidden.shape[0]
        self.rope = rope_tables(spec, min(self.window, hidden.shape[0]))
        self._last_input: torch.Tensor | None = None  # kept by run_layer(keep_input=True)

    def float_layer(self, index: int, tensors: dict[str, torch.Tensor]) -> DecoderLayer:
        """A float32 DecoderLayer holding layer ``index``'s HF tensors (q/k/v, gate/up fused)."""
        layer = DecoderLayer(self.spec, index)
        params = dict(layer.named_parameters())
        prefix = f"layers.{index}."
        for name, target in hf_weight_map(self.spec).items():
            if name in tensors and target.param.startswith(prefix):
                t = tensors[name]
                params[target.param.removeprefix(prefix)].data[target.row_offset:target.row_offset + t.shape[0]] = t.float()
        return layer

    @torch.inference_mode()
    def run_layer(self, index: int, tensors: dict[str, torch.Tensor],
                  hessian_device: torch.device | str | None = None, *, keep_input: bool = False) -> LayerCalibration:
        """Record layer ``index``'s input statistics (and Hessians on ``hessian_device`` when
        given) and move the hidden states past it; ``keep_input`` lets :meth:`redo_layer` move
        them past other weights of this layer instead."""
        if index != self.next_layer:
            raise RuntimeError(f"calibration is at layer {self.next_layer}, not {index}")
        self._last_input = self.hidden if keep_input else None
        layer = self.float_layer(index, tensors)
        probes = {key: _StatsProbe() for key in _PROBES}
        hessians = {key: HessianProbe(hessian_device) for key in _PROBES} if hessian_device is not None else {}
        hooks = [layer.get_submodule(path).register_forward_pre_hook(probes[key]) for key, path in _PROBES.items()]
        hooks += [layer.get_submodule(_PROBES[key]).register_forward_pre_hook(probe) for key, probe in hessians.items()]
        try:
            self.hidden = self._forward(layer, self.hidden)
        finally:
            for hook in hooks:
                hook.remove()
        self.next_layer += 1
        return LayerCalibration({key: probe.stats(f"model.layers.{index}.{_PROBES[key]}") for key, probe in probes.items()},
                                {key: probe.hessian() for key, probe in hessians.items()})

    @torch.inference_mode()
    def redo_layer(self, index: int, tensors: dict[str, torch.Tensor]) -> None:
        """Move the hidden states past layer ``index`` again, from its kept input, through
        ``tensors`` (e.g. the layer as quantized)."""
        if self._last_input is None or index != self.next_layer - 1:
            raise RuntimeError(f"layer {index} was not the last one run with keep_input")
        self.hidden = self._forward(self.float_layer(index, tensors), self._last_input)
        self._last_input = None

    def _forward(self, layer: DecoderLayer, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden`` past ``layer``, one window at a time (the probes add up over windows)."""
        cos, sin = self.rope
        return torch.cat([layer(part, 0, 0, _OneSequenceCache(), (cos[:len(part)], sin[:len(part)]))
                          for part in hidden.split(self.window)])

    @torch.inference_mode()
    def head_stats(self, norm_weight: torch.Tensor, eps: float) -> ActivationStats:
        """Statistics of the lm_head's input (the final RMSNorm's output) after the last layer."""
        if self.next_layer != self.spec.num_layers:
            raise RuntimeError(f"calibration is at layer {self.next_layer}, not past the last one")
        norm = RMSNorm(self.spec.hidden_size, eps)
        norm.weight.data.copy_(norm_weight.float())
        return ActivationStats.from_samples(norm(self.hidden), name="lm_head")

    @torch.inference_mode()
    def head_hessian(self, norm_weight: torch.Tensor, eps: float, device: torch.device | str) -> torch.Tensor:
        """``2 X^T X`` of the lm_head's input after the last layer (for GPTQ of an untied head)."""
        if self.next_layer != self.spec.num_layers:
            raise RuntimeError(f"calibration is at layer {self.next_layer}, not past the last one")
        norm = RMSNorm(self.spec.hidden_size, eps)
        norm.weight.data.copy_(norm_weight.float())
        probe = HessianProbe(device)
        probe.add(norm(self.hidden))
        return probe.hessian()


# Weights of a layer by the probe that sees their input.
INPUTS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
           "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def activation_importance(index: int, stats: dict[str, ActivationStats], recipe: Recipe) -> dict[str, torch.Tensor]:
    """E[x^2] of each quantized weight's input channels: the search's error weights."""
    p = f"model.layers.{index}"
    return {f"{p}.{module}.weight": stats[key].mean_sq for key, modules in INPUTS.items()
            for module in modules if recipe.bits_for(f"{p}.{module}") != 16}


def apply_awq(index: int, tensors: dict[str, torch.Tensor], stats: dict[str, ActivationStats],
              recipe: Recipe) -> dict[str, torch.Tensor]:
    """Rescale layer ``index``'s weights in place (AWQ); return the search importance per weight.

    Only weights the recipe quantizes are rescaled; the scales go into fp16-kept tensors
    (norms, up_proj rows) where needed, which the float model then computes exactly.
    """
    p = f"model.layers.{index}"
    importance = activation_importance(index, stats, recipe)
    down = f"{p}.mlp.down_proj"
    if recipe.bits_for(down) != 16:  # before gate/up: it changes up_proj's rows
        s = _scale(tensors, [f"{down}.weight"], stats["down"], recipe.bits_for(down), importance)
        up_w, up_b = f"{p}.mlp.up_proj.weight", f"{p}.mlp.up_proj.bias"
        tensors[up_w], new_b = fold_into_previous_linear(tensors[up_w].float(), tensors.get(up_b), s)
        if new_b is not None:
            tensors[up_b] = new_b
    for key, norm in (("qkv", "input_layernorm"), ("gate_up", "post_attention_layernorm")):
        names = [f"{p}.{module}.weight" for module in INPUTS[key]]
        bits = recipe.bits_for(names[0].removesuffix(".weight"))
        if bits != 16:
            s = _scale(tensors, names, stats[key], bits, importance)
            norm_name = f"{p}.{norm}.weight"
            tensors[norm_name] = fold_into_norm(tensors[norm_name].float(), s)
    return importance


def _scale(tensors: dict[str, torch.Tensor], names: list[str], stats: ActivationStats, bits: int,
           importance: dict[str, torch.Tensor]) -> torch.Tensor:
    """AWQ-scale the columns of the weights ``names`` (sharing one input); return the scales [K]."""
    k = stats.mean_abs.shape[0]
    pad = padded_k(k) - k
    weights = [F.pad(tensors[n].float(), (0, pad)) for n in names]  # [N, K + pad], zero columns
    # Padded channels get a typical mean |x| (so s's normalisation ignores them) and no error weight.
    padded = ActivationStats(F.pad(stats.mean_abs, (0, pad), value=float(stats.mean_abs.median())),
                             F.pad(stats.mean_sq, (0, pad)), name=stats.name)
    result = awq_search(weights, padded, bits, name=names[0], alpha_steps=AWQ_ALPHA_STEPS)
    scales = result.scales[:k]
    for n in names:
        tensors[n] = scale_weight_columns(tensors[n].float(), scales)
        importance[n] = scaled_importance(stats, scales)
    return scales
