"""Data-free per-group clipping search: scales that beat round-to-nearest; :func:`quantize`
turns one weight into a :class:`~app.formats.tensor.QuantizedTensor` with them.

RTN picks each group's scale so nothing is clipped, which wastes levels on one outlier.
Shrinking the scale clips the outlier a little but rounds the other 127 values on a finer
grid. For every (row, group) we try ``scale = rtn_scale * f`` for f in a shrink grid, keep the
fp16 scale whose reconstruction error ``sum_k c_k * (q_k * s - w_k)^2`` is smallest, then
polish it once with the least-squares scale for the chosen integers. ``c_k`` is an optional
per-input-channel importance (e.g. the mean squared activation, from :mod:`app.quant.awq`);
without it every channel counts the same.

f = 1.0 comes first and a candidate replaces the current best only when it is smaller by a
relative margin, so the result is never worse than RTN for any group, and rounding noise in
the fp32 sums cannot make it flip to an equal-or-worse scale. Everything is vectorised over
rows and groups and processed in row chunks, so the extra memory is bounded by a few copies of
``chunk_elements`` fp32 values whatever the tensor size (a 152k x 3584 embedding included).
"""

from __future__ import annotations

import torch

from app.errors import QwenTrayError
from app.formats.core import (
    DEFAULT_CHUNK_ELEMENTS,
    GROUP_SIZE,
    check_weight,
    grouped,
    qrange,
    quantize_groups,
    row_chunks,
    rtn_scales_fp32,
    to_fp16_scales,
)
from app.formats.tensor import FORMAT_OF_BITS, QuantizedTensor, encode

# 1.00, 0.98, ..., 0.60: the MSE optimum of 4-bit groups sits near 0.85-1.0 and of 3-bit
# groups near 0.7-0.95 for bell-shaped weights; heavier tails push it lower.
DEFAULT_SHRINK_GRID = tuple(round(1.0 - 0.02 * i, 2) for i in range(21))

GPU_CHUNK_ELEMENTS = 1 << 24

# A candidate must beat the current best by this relative amount to replace it (see above).
IMPROVEMENT_MARGIN = 1e-5


def quantize(w: torch.Tensor, bits: int, *, name: str = "weight", method: str = "search",
             importance: torch.Tensor | None = None,
             device: torch.device | str | None = None) -> QuantizedTensor:
    """Quantize W [N, K] to ``bits`` (4 -> "w4", 3 -> "w3").

    ``method="search"`` uses the clipping search (:func:`search_scales`), ``"rtn"`` plain
    round-to-nearest. ``importance`` [K] weights the search's error per input channel.
    """
    if bits not in FORMAT_OF_BITS:
        raise QwenTrayError(f"{name}: cannot quantize to {bits} bits (supported: 3, 4)")
    if method not in ("search", "rtn"):
        raise ValueError(f"method must be 'search' or 'rtn', got {method!r}")
    scales = None
    if method == "search":
        scales = search_scales(w, bits, name=name, importance=importance, device=device)
    return encode(w, bits, scales, name=name)


def search_scales(w: torch.Tensor, bits: int, *, name: str = "weight",
                  importance: torch.Tensor | None = None,
                  shrink_grid: tuple[float, ...] = DEFAULT_SHRINK_GRID,
                  refine: bool = True,
                  device: torch.device | str | None = None,
                  chunk_elements: int | None = None) -> torch.Tensor:
    """Clipping-searched fp16 scales [N, K/128] for ``w`` [N, K] at ``bits`` (3 or 4).

    Pass the result to ``quantize_w4`` / ``quantize_w3``. ``importance`` is an optional
    non-negative weight per input channel [K]. ``device`` runs the search there (e.g.
    ``"cuda"``) chunk by chunk; the scales come back on ``w``'s device. ``chunk_elements``
    bounds the values processed at once (default: ~1 M on CPU, cache sized; ~16 M on a GPU,
    where fewer, larger kernel launches win and the temporaries are still ~64 MiB each).
    """
    n, k = check_weight(w, name)
    if not shrink_grid or shrink_grid[0] != 1.0 or any(not 0.0 < f <= 1.0 for f in shrink_grid):
        raise ValueError("shrink_grid must start with 1.0 and hold factors in (0, 1]")
    work_device = torch.device(device) if device is not None else w.device
    if chunk_elements is None:
        chunk_elements = GPU_CHUNK_ELEMENTS if work_device.type == "cuda" else DEFAULT_CHUNK_ELEMENTS
    channel_w = _channel_weights(importance, k, name, work_device)
    out = torch.empty((n, k // GROUP_SIZE), dtype=torch.float16, device=w.device)
    for rows in row_chunks(n, k, chunk_elements):
        wg = grouped(w[rows].to(work_device))  # [R, G, 128] fp32
        if not bool(torch.isfinite(wg).all()):
            raise QwenTrayError(f"{name}: weight contains NaN or Inf")
        out[rows] = _search_chunk(wg, bits, channel_w, shrink_grid, refine, name).to(w.device)
    return out


def group_errors(wg: torch.Tensor, scales16: torch.Tensor, bits: int,
                 sqrt_channel_w: torch.Tensor | None = None) -> torch.Tensor:
    """Weighted squared reconstruction error per group: [R, G, 128], [R, G] -> [R, G] fp32.

    Same q as :func:`quantize_groups` (round half to even, then clamp) but kept in fp32 and
    computed in place: this loop is the quantizer's hot spot. ``sqrt_channel_w`` is the
    square root of the per-channel importance, [G, 128].
    """
    qmin, qmax = qrange(bits)
    s = scales16.float().unsqueeze(-1)
    diff = torch.div(wg, s).round_().clamp_(qmin, qmax).mul_(s).sub_(wg)  # [R, G, 128]
    if sqrt_channel_w is not None:
        diff.mul_(sqrt_channel_w)
    return torch.linalg.vector_norm(diff, dim=-1).square_()


def _search_chunk(wg: torch.Tensor, bits: int, channel_w: torch.Tensor | None,
                  shrink_grid: tuple[float, ...], refine: bool, name: str) -> torch.Tensor:
    sqrt_w = channel_w.sqrt() if channel_w is not None else None
    base = rtn_scales_fp32(wg, bits)  # [R, G]
    best_s = to_fp16_scales(base, name)
    best_err = group_errors(wg, best_s, bits, sqrt_w)
    for factor in shrink_grid[1:]:
        cand = to_fp16_scales(base * factor, name)
        best_s, best_err = _keep_better(wg, bits, sqrt_w, best_s, best_err, cand)
    if refine:
        cand = _least_squares_scales(wg, best_s, bits, channel_w, name)
        best_s, best_err = _keep_better(wg, bits, sqrt_w, best_s, best_err, cand)
    return best_s


def _keep_better(wg, bits, sqrt_w, best_s, best_err, cand):
    err = group_errors(wg, cand, bits, sqrt_w)
    better = err < best_err * (1.0 - IMPROVEMENT_MARGIN)
    return torch.where(better, cand, best_s), torch.where(better, err, best_err)


def _least_squares_scales(wg: torch.Tensor, scales16: torch.Tensor, bits: int,
                          channel_w: torch.Tensor | None, name: str) -> torch.Tensor:
    """For fixed integers q the error-minimising scale is sum(c q w) / sum(c q q)."""
    q = quantize_groups(wg, scales16, bits).float()
    cq = q * channel_w if channel_w is not None else q
    num = (cq * wg).sum(dim=-1)
    den = (cq * q).sum(dim=-1)
    ls = torch.where(den > 0, num / den.clamp(min=1e-30), scales16.float())
    # A negative or zero LS scale only happens for degenerate groups; keep the current one.
    ls = torch.where(ls > 0, ls, scales16.float())
    return to_fp16_scales(ls, name)


def _channel_weights(importance: torch.Tensor | None, k: int, name: str,
                     device: torch.device) -> torch.Tensor | None:
    """Importance [K] -> [G, 128] fp32 broadcastable against grouped weights, or None."""
    if importance is None:
        return None
    if importance.shape != (k,):
        raise QwenTrayError(f"{name}: importance must have shape ({k},), got {tuple(importance.shape)}")
    imp = importance.to(device=device, dtype=torch.float32)
    if not bool(torch.isfinite(imp).all()) or bool((imp < 0).any()):
        raise QwenTrayError(f"{name}: importance must be finite and >= 0")
    return imp.reshape(k // GROUP_SIZE, GROUP_SIZE)
