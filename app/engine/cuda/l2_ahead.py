"""Which GEMV of a decode step asks L2 for a later GEMV's weights (docs/KERNELS.md phase 17).

A GEMV that has finished its own loads can ask L2 for the weights of one that comes later
(gemv.cu ``ahead``: one ``prefetch.global.L2`` per 128-byte line, spread over its grid), so
those DRAM reads overlap its own tail and the kernel boundary. A site is one (issuing GEMV,
prefetched weight) pair; a prefetched weight must fit in a share of the L2 (``L2_FRACTION``).

What the H200 measured (phase 17): the prefetches are not free for the kernels in between.
Asked for by the qkv, the gate/up's 22 MB slowed the 3B step by 80 µs: the latency-bound
attention and o projection then wait behind that DRAM traffic. The one site that pays is the
down projection's weights asked for by a gate/up that preloaded its own weights into shared
memory before its wait (app.kernels.gemv_preload): its DRAM reads are over before its math
starts, and the down follows at once (3B: -9 µs). So that is the default, and only where the
gate/up preloads. Only with programmatic launches (SM90+); results are unchanged (hints only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from app.engine.cuda.weights import LinearWeight

L2_AHEAD = True  # set to False to turn the prefetches off (benchmarks/ablate_step.py compares)
# (issuing GEMV, weight it prefetches): "qkv>gate_up" = layer i's qkv asks for layer i's gate/up;
# "down>qkv" = layer i's down asks for layer i + 1's qkv. Measured, not used: all but one.
ALL_SITES = ("qkv>o", "qkv>gate_up", "gate_up>down", "down>qkv")
SITES = frozenset({"gate_up>down"})
# "gate_up>down" only where the gate/up preloads (its own reads are done before its math).
GATE_UP_MUST_PRELOAD = True
L2_FRACTION = 0.5  # the most of the L2 one prefetched weight may take


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


def _nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def plan(layers, l2_bytes: int, enabled: bool, preloads: Callable[[LinearWeight], bool] = lambda w: True,
         sites: frozenset[str] | None = None) -> list[LayerAhead]:
    """Per layer, what its GEMVs prefetch. ``layers``: the model's LayerWeights; ``l2_bytes``: the
    GPU's L2; ``enabled``: prefetches are worth issuing (programmatic launches); ``preloads``:
    whether the gated GEMV over a weight copies it into shared memory before its wait;
    ``sites``: a subset of ALL_SITES (default SITES)."""
    sites = SITES if sites is None else sites
    if not enabled or not sites:
        return [NONE] * len(layers)
    limit = int(L2_FRACTION * l2_bytes)

    def fits(w: LinearWeight) -> tuple[torch.Tensor, ...]:
        tensors = weight_tensors(w)
        return tensors if _nbytes(tensors) <= limit else ()

    out = []
    for i, layer in enumerate(layers):
        qkv = (fits(layer.o) if "qkv>o" in sites else ()) + (fits(layer.gate_up) if "qkv>gate_up" in sites else ())
        gate_up = ()
        if "gate_up>down" in sites and (preloads(layer.gate_up) or not GATE_UP_MUST_PRELOAD):
            gate_up = fits(layer.down)
        down = fits(layers[i + 1].qkv) if "down>qkv" in sites and i + 1 < len(layers) else ()
        out.append(LayerAhead(qkv, gate_up, down))
    return out
