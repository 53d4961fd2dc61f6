"""W4/W3 -> fp16 dequantization of weight rows in one CUDA kernel (the GEMM prefill's tiles, and
the embedding lookup: one launch instead of ~13 PyTorch kernels; docs/KERNELS.md § Norm,
embedding lookup, argmax).

Both read the runtime's tile layouts (app.kernels.w4_tiles / w3_tiles), any row range. W4:
one thread per packed word, 8 fp16 out (one 16-byte store). W3: one thread per row and 32
inputs, 3 words in, 32 fp16 out. ``fp16(q * scale)`` with the
product exact in fp32 and one rounding: bit-equal to app.quant and to the PyTorch path of
app.engine.cuda.weights, which is the fallback when this does not compile.

The source is app/kernels/dequant.cu, compiled and launched on PyTorch's current stream
through app.kernels.loader like every other kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from app.engine.cuda.weights import DequantTables, LinearWeight, lookup_rows
from app.kernels import loader

THREADS = 256


class DequantKernel:
    """``kernel(w, start, stop, out)``: rows start..stop-1 of a packed weight into ``out`` [R, K] fp16;
    ``kernel.lookup(w, ids, out)``: rows ``ids`` (the embedding)."""

    def __init__(self, device: torch.device):
        with torch.cuda.device(device):
            self.w4 = loader.get_kernel("dequant.cu", "dequant_w4_tiles_kernel")
            self.w3 = loader.get_kernel("dequant.cu", "dequant_w3_tiles_kernel")

    def __call__(self, w: LinearWeight, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        return self._launch(w, start, stop - start, None, out)

    def lookup(self, w: LinearWeight, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int32 [B] on the device, each < N) of a packed weight into ``out`` [B, K]
        fp16: the embedding lookup in one launch (graph-safe), bit-equal to weights.lookup_rows."""
        if ids.dtype != torch.int32 or ids.dim() != 1 or not ids.is_contiguous() or ids.device != out.device:
            raise loader.KernelArgumentError(f"dequant ids: need a contiguous int32 vector on {out.device}, got "
                                             f"{ids.dtype} {tuple(ids.shape)} on {ids.device}")
        return self._launch(w, 0, ids.shape[0], ids, out)

    def _launch(self, w: LinearWeight, start: int, rows: int, ids: torch.Tensor | None,
                out: torch.Tensor) -> torch.Tensor:
        k = w.in_features
        if tuple(out.shape) != (rows, k) or out.dtype != torch.float16 or not out.is_contiguous():
            raise loader.KernelArgumentError(f"dequant out: need contiguous fp16 [{rows}, {k}], got "
                                             f"{out.dtype} {tuple(out.shape)}")
        if out.data_ptr() % 16:
            raise loader.KernelArgumentError("dequant out: must be 16-byte aligned")
        if w.layout != "tiles":
            raise loader.KernelArgumentError(f"{w.name}: the dequantizer reads the tile layout "
                                             "(app.engine.cuda.layout.to_kernel_layout)")
        ids_ptr = 0 if ids is None else ids.data_ptr()
        if w.bits == 4:
            words = rows * (k // 8)  # threads: one per output word
            args = (w.qa.data_ptr(), w.scales.data_ptr(), out.data_ptr(), np.int64(start), np.int64(words),
                    np.int32(k // 128), ids_ptr)
            kernel = self.w4
        else:
            words = rows * (k // 32)  # threads: one per row and 32 inputs
            args = (w.qa.data_ptr(), w.qb.data_ptr(), w.scales.data_ptr(), out.data_ptr(), np.int64(start),
                    np.int64(words), np.int32(k // 128), ids_ptr)
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


def embedding_rows(w: LinearWeight, ids: torch.Tensor, tables: DequantTables, out: torch.Tensor,
                   kernel: DequantKernel | None) -> torch.Tensor:
    """Rows ``ids`` of the embedding ``w`` into ``out``: the kernel's one launch where it reads
    ``w`` (packed, tile layout), else PyTorch (weights.lookup_rows; the same bits)."""
    if kernel is not None and w.quantized and w.layout == "tiles" and ids.dtype == torch.int32:
        return kernel.lookup(w, ids, out)
    return lookup_rows(w, ids, tables, out)
