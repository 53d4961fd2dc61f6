"""What the GEMV's tile layouts share (app.kernels.w4_tiles, w3_tiles): 16-row tiles of
128-input groups, padding to whole tiles, and repacking a tensor in place a chunk at a time
(tiles t0..t1 occupy exactly the bytes of rows 16 t0 .. 16 t1, so a chunk of rows can be
read, repacked and written back without a second copy of the whole weight)."""

from __future__ import annotations

from collections.abc import Callable

import torch

TILE_ROWS = 16
GROUP = 128
REPACK_CHUNK_ELEMENTS = 1 << 21  # weights per in-place chunk: bounds the temporaries (~50 MB)


def padded_rows(n: int) -> int:
    return -(-n // TILE_ROWS) * TILE_ROWS


def check_tileable(n: int, k: int, name: str = "weight") -> None:
    if n % TILE_ROWS or k % GROUP:
        raise ValueError(f"{name}: the tile layout needs N % {TILE_ROWS} == 0 and K % {GROUP} == 0, "
                         f"got N={n}, K={k}")


def repack_in_place(tensors: tuple[torch.Tensor, ...], k: int,
                    repack: Callable[..., tuple[torch.Tensor, ...]]) -> None:
    """``tensors`` (row-major, N rows, N a multiple of 16) replaced by ``repack(*row chunks)``,
    chunk by chunk; ``repack`` returns tensors of the same shapes as its arguments."""
    n = tensors[0].shape[0]
    check_tileable(n, k)
    rows = max(TILE_ROWS, REPACK_CHUNK_ELEMENTS // k // TILE_ROWS * TILE_ROWS)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        for t, new in zip(tensors, repack(*(t[r0:r1] for t in tensors))):
            t[r0:r1].copy_(new)
