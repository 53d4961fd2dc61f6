"""W4 "tiles" layout: how the GPU holds 4-bit weights (the checkpoint's words, regrouped).

The checkpoint's ``qweight`` (docs/FORMATS.md) is row-major: a warp of the GEMV, which reads
16 rows x 128 inputs per step (app/kernels/gemv.cu: lane ``4g + t`` takes rows g and g + 8,
inputs 32t .. 32t + 31 of the group), touched 16 separate 64-byte pieces per load. On the
GPU every W4 weight is regrouped, in place, so that each of a warp's two loads per group is
one contiguous 512-byte span (fewer distinct cache lines per load; docs/KERNELS.md § Weight layouts)::

    a: [N/16 tiles][K/128 groups][2 halves h][32 lanes][4 words]
       lane 4g + t of half h: row 16 tile + 8h + g, the words 16 group + 4t .. + 3 of its
       checkpoint row (k = 128 group + 32t .. + 31), bits unchanged

Only words move, so the nibble order, the magic-number decode and the scales (still
[N, K/128]) stay as the checkpoint has them. Tiles t0..t1 occupy exactly the bytes of rows
16 t0 .. 16 t1 of the [N, K/8] tensor: the repack works in place, chunk by chunk; when N is
not a multiple of 16 a new tensor of ``padded_rows(N)`` rows holds zero padding rows.

Pure PyTorch, any device, no host synchronisation (usable inside a CUDA graph capture).
"""

from __future__ import annotations

import torch

from app.kernels.tiles import GROUP, TILE_ROWS, check_tileable, padded_rows, repack_in_place

WORDS_PER_GROUP = GROUP // 8  # int32 words per row and group


def repack_w4_tiles(qweight: torch.Tensor) -> torch.Tensor:
    """Checkpoint W4 ``qweight`` [N, K/8] -> tile layout [padded_rows(N), K/8], a new tensor."""
    n, words = qweight.shape
    if n % TILE_ROWS:
        qweight = torch.cat([qweight, qweight.new_zeros((padded_rows(n) - n, words))])
    rows = qweight.shape[0]
    check_tileable(rows, words * 8)
    groups = words // WORDS_PER_GROUP
    v = qweight.view(rows // TILE_ROWS, 2, 8, groups, 4, 4)  # [tile, h, g, group, t, word]
    return v.permute(0, 3, 1, 2, 4, 5).reshape(rows, words).contiguous()  # [tile, group, h, g, t, word]


def repack_w4_tiles_(qweight: torch.Tensor) -> None:
    """:func:`repack_w4_tiles` inside ``qweight`` itself (N a multiple of 16), a chunk at a time."""
    repack_in_place((qweight,), qweight.shape[1] * 8, lambda chunk: (repack_w4_tiles(chunk),))


def tile_words(a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Checkpoint-layout words of rows ``rows`` (int64 [R], any order) -> int32 [R, K/8]."""
    n, words = a.shape
    groups = words // WORDS_PER_GROUP
    tile, slot = rows // TILE_ROWS, rows % TILE_ROWS
    a6 = a.view(n // TILE_ROWS, groups, 2, 8, 4, 4)  # [tile, group, h, g, t, word]
    picked = a6[tile, :, slot // 8, slot % 8]  # [R, group, t, word] (advanced indices first)
    return picked.reshape(rows.shape[0], words)


def unpack_w4_tiles(a: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Tile layout -> checkpoint ``qweight`` of the first ``n`` rows (default all)."""
    return tile_words(a, torch.arange(a.shape[0] if n is None else n, device=a.device))
