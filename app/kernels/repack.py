"""W4/W3 checkpoint words -> the GEMV's tile layouts in one CUDA kernel per chunk (load time).

Why: every load repacks every packed weight (app.engine.cuda.layout). The PyTorch repack of
W3 (app.kernels.w3_tiles) is a dozen whole-chunk passes with int64 temporaries, and a 7B's
5.7 G three-bit weights took most of a cached GPU load there. Here one thread per GEMV lane
reads its two rows' checkpoint words and writes the lane's tile words: one launch and one
copy back per chunk. Integer moves only, so the result is bit-equal to the PyTorch repack,
which stays the reference and the path wherever this does not compile (the loader says why).

In place like app.kernels.tiles.repack_in_place: tiles t0..t1 occupy exactly the bytes of
rows 16 t0 .. 16 t1, so a chunk of rows is repacked into a scratch buffer and copied back.
The source is repack.cu, built and launched through app.kernels.loader.
"""

from __future__ import annotations

import numpy as np
import torch

from app.kernels import loader
from app.kernels.tiles import GROUP, TILE_ROWS, check_tileable

THREADS = 256
CHUNK_ELEMENTS = 1 << 24  # weights per chunk: a scratch buffer of 6 MB (W3) / 8 MB (W4)


class TileRepackKernel:
    """``w3_(qlow, qhigh)`` / ``w4_(qweight)``: a checkpoint-layout weight (N a multiple of 16,
    contiguous, on this kernel's GPU) repacked into the tile layout inside its own tensors."""

    def __init__(self, device: torch.device):
        with torch.cuda.device(device):
            self._w3 = loader.get_kernel("repack.cu", "repack_w3_tiles_kernel")
            self._w4 = loader.get_kernel("repack.cu", "repack_w4_tiles_kernel")

    def w3_(self, qlow: torch.Tensor, qhigh: torch.Tensor) -> None:
        n, k = qlow.shape[0], qlow.shape[1] * 16
        _check(n, k, (qlow, qhigh), "W3")
        if qhigh.shape != (n, k // 32):
            raise loader.KernelArgumentError(f"repack W3: qhigh {tuple(qhigh.shape)} does not match qlow "
                                             f"{tuple(qlow.shape)}")
        groups = k // GROUP
        for r0, r1, rows in _chunks(n, k):
            a, b = _scratch(qlow, rows, k // 16), _scratch(qhigh, rows, k // 32)
            lanes = (r1 - r0) // TILE_ROWS * groups * 32
            loader.launch(self._w3, (-(-lanes // THREADS),), (THREADS,),
                          (qlow[r0].data_ptr(), qhigh[r0].data_ptr(), a.data_ptr(), b.data_ptr(), np.int64(lanes),
                           np.int32(groups)))
            qlow[r0:r1].copy_(a[:r1 - r0])
            qhigh[r0:r1].copy_(b[:r1 - r0])

    def w4_(self, qweight: torch.Tensor) -> None:
        n, k = qweight.shape[0], qweight.shape[1] * 8
        _check(n, k, (qweight,), "W4")
        groups = k // GROUP
        for r0, r1, rows in _chunks(n, k):
            out = _scratch(qweight, rows, k // 8)
            vectors = (r1 - r0) * (k // 32)  # 16-byte vectors: 4 per row and group
            loader.launch(self._w4, (-(-vectors // THREADS),), (THREADS,),
                          (qweight[r0].data_ptr(), out.data_ptr(), np.int64(vectors), np.int32(groups)))
            qweight[r0:r1].copy_(out[:r1 - r0])


def _check(n: int, k: int, tensors: tuple[torch.Tensor, ...], what: str) -> None:
    try:
        check_tileable(n, k, f"repack {what}")
    except ValueError as e:
        raise loader.KernelArgumentError(str(e)) from None
    for t in tensors:
        if t.dtype != torch.int32 or not t.is_cuda or not t.is_contiguous() or t.data_ptr() % 16:
            raise loader.KernelArgumentError(f"repack {what}: need contiguous, 16-byte aligned int32 CUDA "
                                             f"tensors, got {t.dtype} {tuple(t.shape)} on {t.device}")


def _chunks(n: int, k: int):
    """(first row, end row, scratch rows) of each chunk: whole tiles, about CHUNK_ELEMENTS weights."""
    rows = min(n, max(TILE_ROWS, CHUNK_ELEMENTS // k // TILE_ROWS * TILE_ROWS))
    for r0 in range(0, n, rows):
        yield r0, min(n, r0 + rows), rows


def _scratch(like: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    # the caching allocator hands the same block back chunk after chunk (and weight after weight)
    return torch.empty((rows, cols), dtype=torch.int32, device=like.device)


def tile_repack_kernel_or_none(device: torch.device) -> tuple[TileRepackKernel | None, str | None]:
    """The kernel, or None and why (the PyTorch repack is then used)."""
    try:
        return TileRepackKernel(device), None
    except loader.KernelError as e:
        return None, str(e)
