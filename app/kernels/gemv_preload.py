"""Preloaded GEMV weights: when a GEMV's blocks all fit on the GPU at once, copy each warp's
weights into shared memory before the programmatic wait (docs/KERNELS.md § Preloaded weights).

With programmatic launches (SM90+) a GEMV's blocks are resident while the kernels before it
(the attention, the small projections: latency-bound, DRAM idle) still run. A register stage
holds only the first group of 128 inputs per warp; the rest is read after the wait, a chain of
round trips per warp. Here every lane copies its fragments of all the groups its warp walks
into shared memory (``cp.async``, no registers held) before the wait, and after it reads them
back from there. The values and the summation order are those of the register path: outputs
are bit-identical for the same :class:`GemvConfig`.

It pays only if the copies land during that window, so it is used only where the whole grid
is resident at once (the driver's occupancy calculator, with the kernel's real registers and
shared memory), and only where launches are programmatic. The plan depends on the weight's
shape and the GPU, never on the batch size: the configuration it picks (possibly fewer warps
per block than :func:`~app.kernels.gemv.default_gemv_config`, so the grid fits) is used for
every batch, and only the one-column-block launches (batch <= 8) preload, so row m of a
batched call stays bit-equal to the batch-1 call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from app.kernels.tiles import GROUP, TILE_ROWS

# The compiled bounds of the groups a warp preloads (gemv.cu PRELOAD; its scales stay in registers).
GROUP_BOUNDS = (2, 4, 8)
# Shared memory one lane-set of a tile and a group takes: W4 2 x 16 B x 32 lanes, W3 (16 + 8) B x 32.
BYTES_PER_TILE_GROUP = {4: 1024, 3: 768}


@dataclass(frozen=True)
class PreloadPlan:
    """Preload with ``warps`` per block (one tile per warp), ``groups`` the compiled bound of the
    groups each warp copies, ``weight_bytes`` the dynamic shared memory of the copies per block."""

    warps: int
    groups: int
    weight_bytes: int


def group_bound(groups_per_warp: int) -> int | None:
    """The smallest compiled bound that holds ``groups_per_warp`` groups, None above 8."""
    return next((b for b in GROUP_BOUNDS if b >= groups_per_warp), None)


def plan(n_out: int, k: int, gated: bool, bits: int, warps: int, sm_count: int, x_bytes: int,
         resident_blocks: Callable[[int, int, int], int]) -> PreloadPlan | None:
    """The preload for a GEMV whose default split has ``warps`` warps of one tile, or None.

    Tries ``warps``, then halves it (each warp then walks twice the groups, and the blocks are
    smaller) until the grid fits in one wave: ``resident_blocks(warps, bound, shared bytes)``
    is how many such blocks an SM holds. ``x_bytes``: the most staged x any batch puts before
    the copies. Needs at least 2 groups per warp (one is what the register stage holds anyway).
    """
    groups = k // GROUP
    blocks = -(-n_out // TILE_ROWS)
    fewest = 2 if gated else 1  # gated: warps alternate gate / up
    while warps >= fewest:
        slices = warps // 2 if gated else warps
        per_warp = -(-groups // slices)
        bound = group_bound(per_warp)
        if bound is None:
            return None  # fewer warps only walk more groups
        weight_bytes = warps * per_warp * BYTES_PER_TILE_GROUP[bits]
        if per_warp >= 2 and blocks <= sm_count * resident_blocks(warps, bound, x_bytes + weight_bytes):
            return PreloadPlan(warps, bound, weight_bytes)
        warps //= 2
    return None
