"""Activation-aware per-input-channel scaling (AWQ-style), given activation statistics.

A few input channels of a linear layer carry much larger activations than the rest; their
weights matter more. Multiplying weight column k by ``s_k > 1`` (and dividing the input by
``s_k``, folded into the previous RMSNorm or linear so the float model is unchanged) gives that
column a relatively finer quantization grid. With ``s = mean|x|^alpha`` we pick the alpha in
[0, 1] minimising the expected output error under a diagonal model of the inputs:

    err(alpha) = sum_k E[x_k^2] * sum_n (W[n, k] - Q(W * s)[n, k] / s_k)^2

summed over all linears sharing that input (q/k/v share input_layernorm, gate/up share
post_attention_layernorm). alpha = 0 is s = 1, i.e. plain quantization, and is kept unless
another alpha is strictly better. The calibration pass that produces the statistics is wired
by the engine; this module only takes ``ActivationStats``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from app.errors import QwenTrayError
from app.formats.core import (
    DEFAULT_CHUNK_ELEMENTS,
    check_weight,
    grouped,
    quantize_groups,
    row_chunks,
    rtn_scales_fp32,
    to_fp16_scales,
)

DEFAULT_ALPHA_STEPS = 20  # alpha in {0, 0.05, ..., 1.0}
MIN_CHANNEL_SCALE = 1e-4  # keeps 1/s finite for dead channels


@dataclass(frozen=True)
class ActivationStats:
    """Per-input-channel statistics of a linear layer's input over calibration tokens.

    ``mean_abs`` = E|x_k| (sets the scale shape), ``mean_sq`` = E[x_k^2] (weights the error).
    """

    mean_abs: torch.Tensor  # [K]
    mean_sq: torch.Tensor  # [K]
    name: str = "activations"

    def __post_init__(self) -> None:
        for label, t in (("mean_abs", self.mean_abs), ("mean_sq", self.mean_sq)):
            if t.dim() != 1:
                raise QwenTrayError(f"{self.name}.{label}: must be 1-D [K], got {tuple(t.shape)}")
            if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
                raise QwenTrayError(f"{self.name}.{label}: must be finite and >= 0")
        if self.mean_abs.shape != self.mean_sq.shape:
            raise QwenTrayError(f"{self.name}: mean_abs {tuple(self.mean_abs.shape)} and mean_sq "
                                f"{tuple(self.mean_sq.shape)} differ")

    @classmethod
    def from_samples(cls, x: torch.Tensor, name: str = "activations") -> ActivationStats:
        """Statistics of samples x [..., K] (all leading dims are tokens)."""
        flat = x.reshape(-1, x.shape[-1]).float()
        return cls(flat.abs().mean(dim=0), flat.square().mean(dim=0), name=name)


@dataclass(frozen=True)
class AwqResult:
    scales: torch.Tensor  # [K] fp32: multiply weight columns by it, divide the input by it
    alpha: float
    error: float  # err(alpha) of the chosen alpha
    baseline_error: float  # err(0): plain quantization


def awq_search(weights: Sequence[torch.Tensor], stats: ActivationStats, bits: int, *,
               alpha_steps: int = DEFAULT_ALPHA_STEPS, name: str = "linear") -> AwqResult:
    """Best per-channel scales for linears ``weights`` (each [N_i, K]) sharing one input."""
    if not weights:
        raise ValueError("awq_search needs at least one weight")
    k = stats.mean_abs.shape[0]
    for w in weights:
        _, wk = check_weight(w, name)
        if wk != k:
            raise QwenTrayError(f"{name}: weight K={wk} does not match activation statistics K={k}")
    mean_abs = stats.mean_abs.float().to(weights[0].device)
    mean_sq = stats.mean_sq.float().to(weights[0].device)
    best: AwqResult | None = None
    for step in range(alpha_steps + 1):
        alpha = step / alpha_steps
        s = channel_scales(mean_abs, alpha)
        err = sum(_scaled_error(w, s, mean_sq, bits) for w in weights)
        if best is None:
            best = AwqResult(s, alpha, err, err)
        elif err < best.error * (1.0 - 1e-6):
            best = AwqResult(s, alpha, err, best.baseline_error)
    assert best is not None
    return best


def scaled_importance(stats: ActivationStats, scales: torch.Tensor) -> torch.Tensor:
    """Per-channel importance for the clipping search of the scaled weight W * s.

    Its input is x / s, so E[(x_k / s_k)^2] = E[x_k^2] / s_k^2. Pass it as ``importance=``
    to :func:`app.formats.tensor.quantize` / :func:`app.quant.search.search_scales`.
    """
    return stats.mean_sq.float() / scales.float().square()


def channel_scales(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|x|^alpha normalised so sqrt(max * min) = 1 (the scale only shifts emphasis)."""
    s = mean_abs.clamp(min=MIN_CHANNEL_SCALE).pow(alpha)
    s = s / (s.max() * s.min()).sqrt()
    return s.clamp(min=MIN_CHANNEL_SCALE)


def _scaled_error(w: torch.Tensor, s: torch.Tensor, mean_sq: torch.Tensor, bits: int,
                  chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> float:
    """sum_k E[x_k^2] * sum_n (W - Q(W s) / s)^2 with round-to-nearest group scales."""
    total = 0.0
    for rows in row_chunks(w.shape[0], w.shape[1], chunk_elements):
        wf = w[rows].float()
        ws = grouped(wf * s)  # [R, G, 128]
        scales16 = to_fp16_scales(rtn_scales_fp32(ws, bits), "awq")
        deq = quantize_groups(ws, scales16, bits).float() * scales16.float().unsqueeze(-1)
        eff = deq.reshape(wf.shape) / s  # the weight the scaled model effectively uses
        total += float(((eff - wf).square() * mean_sq).sum())
    return total


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 -> fp32 for the arithmetic (fp64 stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def scale_weight_columns(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> W * s[k] per column (the weight that then gets quantized)."""
    return (_wide(w) * s.to(_wide(w).dtype)).to(w.dtype)


def fold_into_norm(norm_weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """RMSNorm weight [K] / s: the norm now emits x / s, so (x / s) @ (W s).T == x @ W.T."""
    wide = _wide(norm_weight)
    return (wide / s.to(wide.dtype)).to(norm_weight.dtype)


def fold_into_previous_linear(weight: torch.Tensor, bias: torch.Tensor | None,
                              s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Divide output rows of the linear feeding this input (e.g. up_proj before down_proj).

    Only valid when that linear's outputs ARE the next layer's inputs one to one (not for
    v_proj -> o_proj under grouped-query attention, where v rows are shared by several heads).
    """
    if weight.shape[0] != s.shape[0]:
        raise QwenTrayError(f"previous linear has {weight.shape[0]} outputs, scales have {s.shape[0]}")
    wide = _wide(weight)
    new_w = (wide / s.to(wide.dtype).unsqueeze(1)).to(weight.dtype)
    new_b = None if bias is None else (_wide(bias) / s.to(_wide(bias).dtype)).to(bias.dtype)
    return new_w, new_b
