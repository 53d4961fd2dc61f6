"""Which GEMV of a decode step asks L2 for a later GEMV's weights (docs/KERNELS.md phase 17).

With programmatic launches a GEMV's weights stream from DRAM only once the GEMV runs, while the
latency-bound kernels before it (the attention block, a kernel's tail) leave DRAM idle. A GEMV
that has finished its own loads can instead ask L2 for the weights of one that comes later
(gemv.cu ``ahead``: one ``prefetch.global.L2`` per 128-byte line, spread over its grid), so
those reads overlap the kernels in between. A site is one (issuing GEMV, prefetched weight)
pair; each prefetch takes at most a fraction of the L2 (``L2_FRACTION``), so the prefetches
of one layer cannot evict each other or the lines the kernels in between read. Of a larger
weight, only the rows its GEMV's first blocks read (``PARTIAL``).

Only with programmatic launches (SM90+): without them there is no window to fill, and an
RTX 3050's 2 MB L2 would hold none of these weights. Hints only: results are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.engine.cuda.weights import LinearWeight
from app.kernels.tiles import TILE_ROWS

L2_AHEAD = True  # set to False to turn the prefetches off (benchmarks/ablate_step.py compares)
# (issuing GEMV, weight it prefetches): "qkv>gate_up" = layer i's qkv asks for layer i's gate/up;
# "down>qkv" = layer i's down asks for layer i + 1's qkv.
# "down>gate_up": layer i's down asks for layer i + 1's gate/up (earlier than its qkv would).
ALL_SITES = ("qkv>o", "qkv>gate_up", "gate_up>down", "down>qkv", "down>gate_up")
SITES = frozenset(ALL_SITES[:4])
L2_FRACTION = 0.5  # the most of the L2 one prefetched weight may take
# A weight larger than that: prefetch the rows its first blocks read, up to the same share.
PARTIAL = True


@dataclass(frozen=True)
class LayerAhead:
    """The tensors each GEMV of one layer prefetches (empty tuples: none)."""

    qkv: tuple[torch.Tensor, ...] = ()
    gate_up: tuple[torch.Tensor, ...] = ()
    down: tuple[torch.Tensor, ...] = ()


NONE = LayerAhead()


def weight_tensors(w: LinearWeight) -> tuple[torch.Tensor, ...]:
    """The tensors a GEMV over ``w`` reads (the packed tiles and scales; nothing for a dense one)."""
    if not w.quantized:
        return ()
    return tuple(t for t in (w.qa, w.qb, w.scales) if t is not None)


def leading_rows(w: LinearWeight, limit: int, gated: bool) -> tuple[torch.Tensor, ...]:
    """Views of the first whole tiles of ``w``'s rows (of each half, gate and up, when ``gated``)
    taking at most ``limit`` bytes: the rows the GEMV's first blocks read, the first wave of a
    grid larger than the GPU holds at once."""
    tensors = weight_tensors(w)
    halves = 2 if gated else 1
    per_row = _nbytes(tensors) / w.out_features  # every tensor's rows run over the output rows
    rows = int(limit / (halves * per_row)) // TILE_ROWS * TILE_ROWS
    rows = min(rows, w.out_features // halves)
    if rows <= 0:
        return ()
    half = w.out_features // halves
    return tuple(t[start:start + rows] for t in tensors for start in range(0, halves * half, half))


def _nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def plan(layers, l2_bytes: int, enabled: bool, sites: frozenset[str] | None = None) -> list[LayerAhead]:
    """Per layer, what its GEMVs prefetch. ``layers``: the model's LayerWeights; ``l2_bytes``: the
    GPU's L2; ``enabled``: prefetches are worth issuing (programmatic launches); ``sites``: a
    subset of ALL_SITES (default SITES)."""
    sites = SITES if sites is None else sites
    if not enabled or not sites:
        return [NONE] * len(layers)
    limit = int(L2_FRACTION * l2_bytes)

    def fits(w: LinearWeight, gated: bool = False) -> tuple[torch.Tensor, ...]:
        tensors = weight_tensors(w)
        if _nbytes(tensors) <= limit:
            return tensors
        return leading_rows(w, limit, gated) if PARTIAL else ()

    out = []
    for i, layer in enumerate(layers):
        qkv = fits(layer.o) if "qkv>o" in sites else ()
        qkv += fits(layer.gate_up, gated=True) if "qkv>gate_up" in sites else ()
        gate_up = fits(layer.down) if "gate_up>down" in sites else ()
        down: tuple[torch.Tensor, ...] = ()
        if i + 1 < len(layers):
            down += fits(layers[i + 1].qkv) if "down>qkv" in sites else ()
            down += fits(layers[i + 1].gate_up, gated=True) if "down>gate_up" in sites else ()
        out.append(LayerAhead(qkv, gate_up, down))
    return out
