"""W4/W3 -> fp16 dequantization of weight rows in one CUDA kernel (the GEMM prefill's tiles, and
the embedding lookup: one launch instead of ~13 PyTorch kernels; docs/KERNELS.md § Norm,
embedding lookup, argmax).

Both read the tile layouts (app.kernels.w4_tiles / w3_tiles), any row range. W4: one thread
per packed word, 8 fp16 out (one 16-byte store). W3: one thread per row and 32 inputs, 3 words
in, 32 fp16 out. ``fp16(q * scale)`` with the product exact in fp32 and one rounding:
bit-equal to app.formats and to the PyTorch path of app.engine.cuda.weights, which is the
fallback when this does not compile.

The source is dequant.cu, compiled and launched on PyTorch's current stream through
app.kernels.loader like every other kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from app.kernels import loader

THREADS = 256
GROUP_SIZE = 128


class DequantKernel:
    """``rows(...)``: rows start..stop-1 of a packed weight in the tile layout into ``out``
    [R, K] fp16; ``lookup(...)``: rows ``ids`` (the embedding). A weight is ``bits`` (4 or 3),
    its tile words ``qa`` (and ``qb`` for W3) and its fp16 ``scales`` [N, K/128]."""

    def __init__(self, device: torch.device):
        with torch.cuda.device(device):
            self.w4 = loader.get_kernel("dequant.cu", "dequant_w4_tiles_kernel")
            self.w3 = loader.get_kernel("dequant.cu", "dequant_w3_tiles_kernel")

    def rows(self, bits: int, qa: torch.Tensor, qb: torch.Tensor | None, scales: torch.Tensor, start: int,
             stop: int, out: torch.Tensor) -> torch.Tensor:
        return self._launch(bits, qa, qb, scales, start, stop - start, None, out)

    def lookup(self, bits: int, qa: torch.Tensor, qb: torch.Tensor | None, scales: torch.Tensor, ids: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int32 [B] on the device, each < N) into ``out`` [B, K] fp16: the
        embedding lookup in one launch (graph-safe)."""
        if ids.dtype != torch.int32 or ids.dim() != 1 or not ids.is_contiguous() or ids.device != out.device:
            raise loader.KernelArgumentError(f"dequant ids: need a contiguous int32 vector on {out.device}, got "
                                             f"{ids.dtype} {tuple(ids.shape)} on {ids.device}")
        return self._launch(bits, qa, qb, scales, 0, ids.shape[0], ids, out)

    def _launch(self, bits: int, qa: torch.Tensor, qb: torch.Tensor | None, scales: torch.Tensor, start: int,
                rows: int, ids: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
        k = scales.shape[1] * GROUP_SIZE
        if tuple(out.shape) != (rows, k) or out.dtype != torch.float16 or not out.is_contiguous():
            raise loader.KernelArgumentError(f"dequant out: need contiguous fp16 [{rows}, {k}], got "
                                             f"{out.dtype} {tuple(out.shape)}")
        if out.data_ptr() % 16:
            raise loader.KernelArgumentError("dequant out: must be 16-byte aligned")
        ids_ptr = 0 if ids is None else ids.data_ptr()
        if bits == 4:
            words = rows * (k // 8)  # threads: one per output word
            args = (qa.data_ptr(), scales.data_ptr(), out.data_ptr(), np.int64(start), np.int64(words),
                    np.int32(k // GROUP_SIZE), ids_ptr)
            kernel = self.w4
        else:
            words = rows * (k // 32)  # threads: one per row and 32 inputs
            args = (qa.data_ptr(), qb.data_ptr(), scales.data_ptr(), out.data_ptr(), np.int64(start),
                    np.int64(words), np.int32(k // GROUP_SIZE), ids_ptr)
            kernel = self.w3
        if words:
            loader.launch(kernel, ((words + THREADS - 1) // THREADS,), (THREADS,), args)
        return out


def dequant_kernel_or_none(device: torch.device) -> tuple[DequantKernel | None, str | None]:
    """The kernel, or None and why (the PyTorch dequantizer is then used)."""
    try:
        return DequantKernel(device), None
    except loader.KernelError as e:
        return None, str(e)
