"""The GEMV's weight layouts: every packed weight repacked once, when the runtime takes it.

The kernels read W4 and W3 in tile layouts (app.kernels.w4_tiles, w3_tiles) that keep a
checkpoint's bytes but regroup them per 16-row tile and GEMV lane. :func:`to_kernel_layout`
converts a :class:`~app.engine.cuda.weights.ModelWeights` (in place inside the runner's arena,
or into copies); :func:`kernel_layout_extra_bytes` is what the VRAM plan adds for the few
weights that need a copy.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from app.engine.cuda.synthetic import dequantized_linear
from app.engine.cuda.weights import LinearWeight, ModelWeights, aligned_nbytes
from app.kernels.repack import TileRepackKernel
from app.kernels.tiles import TILE_ROWS, padded_rows
from app.kernels.w3_tiles import repack_w3_tiles, repack_w3_tiles_
from app.kernels.w4_tiles import repack_w4_tiles, repack_w4_tiles_

log = logging.getLogger(__name__)

GEMV_PARTS = (("qkv", False), ("o", False), ("gate_up", True), ("down", False))  # (layer attribute, gated)


def to_kernel_layout(weights: ModelWeights, *, in_place: bool,
                     repack_kernel: TileRepackKernel | None = None) -> ModelWeights:
    """Every packed weight a GEMV reads (the layers' linears, the head) in the tile layout.

    ``in_place`` repacks inside the weight's own tensors (the runner owns them: no second
    copy in VRAM); otherwise, and when N is not a multiple of 16 (a padded last tile: e.g. a
    vocabulary of 32,001), into new tensors (:func:`kernel_layout_extra_bytes` counts them).
    A gate/up whose halves do not fill 16-row tiles (no Qwen or Llama shape) runs dense. A
    tied embedding stays tied: the lookup reads the tile layout too. An untied embedding is
    repacked only in place (the dequantization kernel then looks its rows up in one launch).
    ``repack_kernel`` does the in-place repacks on the GPU (app.kernels.repack), else PyTorch.
    """
    memo: dict[int, LinearWeight] = {}

    def convert(w: LinearWeight, gated: bool = False) -> LinearWeight:
        if id(w) not in memo:
            memo[id(w)] = _tiled(w, gated, in_place, repack_kernel)
        return memo[id(w)]

    layers = [replace(layer, **{part: convert(getattr(layer, part), gated) for part, gated in GEMV_PARTS})
              for layer in weights.layers]
    head = convert(weights.lm_head)
    embed = memo.get(id(weights.embed))
    if embed is None:  # untied: repacked too where that needs no copy (one-launch lookup, dequant.py)
        embed = convert(weights.embed) if in_place and _needs_copy(weights.embed, False) is None else weights.embed
    return replace(weights, embed=embed, layers=layers, lm_head=head)


def _needs_copy(w: LinearWeight, gated: bool) -> str | None:
    """Why converting ``w`` cannot happen in place: "dense", "padded", or None."""
    if not w.quantized or w.layout == "tiles":
        return None
    if gated and w.out_features % (2 * TILE_ROWS):
        return "dense"
    return "padded" if w.out_features % TILE_ROWS else None


def kernel_layout_extra_bytes(weights: ModelWeights) -> int:
    """VRAM that :func:`to_kernel_layout` (in place) adds beside the weights' own tensors."""
    extra, seen = 0, set()
    linears = [(getattr(layer, part), gated) for layer in weights.layers for part, gated in GEMV_PARTS]
    for w, gated in linears + [(weights.lm_head, False)]:
        why = _needs_copy(w, gated)
        if why is None or id(w) in seen:
            continue
        seen.add(id(w))
        n, k = w.out_features, w.in_features
        if why == "dense":
            extra += aligned_nbytes(n * k * 2)
        else:
            extra += sum(aligned_nbytes(padded_rows(n) * t.shape[1] * 4) for t in (w.qa, w.qb) if t is not None)
    return extra


def _tiled(w: LinearWeight, gated: bool, in_place: bool, kernel: TileRepackKernel | None) -> LinearWeight:
    if not w.quantized or w.layout == "tiles":
        return w
    why = _needs_copy(w, gated)
    if why == "dense":
        log.info("%s: gate/up halves of %d rows do not fill 16-row tiles; running it dense", w.name,
                 w.out_features // 2)
        return LinearWeight(16, w.out_features, w.in_features, bias=w.bias, name=w.name,
                            dense=dequantized_linear(w).half())
    if in_place and why is None:
        if kernel is not None and w.qa.is_cuda and w.bits == 4:
            kernel.w4_(w.qa)
        elif kernel is not None and w.qa.is_cuda:
            kernel.w3_(w.qa, w.qb)
        elif w.bits == 4:
            repack_w4_tiles_(w.qa)
        else:
            repack_w3_tiles_(w.qa, w.qb)
        return replace(w, layout="tiles")
    if w.bits == 4:
        return replace(w, qa=repack_w4_tiles(w.qa), layout="tiles")
    a, b = repack_w3_tiles(w.qa, w.qb)
    return replace(w, qa=a, qb=b, layout="tiles")
