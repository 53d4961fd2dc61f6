"""W4/W3 -> fp16 dequantization of weight rows in one CUDA kernel (the GEMM prefill's tiles).

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

from app.engine.cuda.weights import LinearWeight
from app.kernels import loader

THREADS = 256


class DequantKernel:
    """``kernel(w, start, stop, out)``: rows start..stop-1 of a packed weight into ``out`` [R, K] fp16."""

    def __init__(self, device: torch.device):
        with torch.cuda.device(device):
            self.w4 = loader.get_kernel("dequant.cu", "dequant_w4_tiles_kernel")
            self.w3 = loader.get_kernel("dequant.cu", "dequant_w3_tiles_kernel")

    def __call__(self, w: LinearWeight, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        rows, k = stop - start, w.in_features
        if tuple(out.shape) != (rows, k) or out.dtype != torch.float16 or not out.is_contiguous():
            raise loader.KernelArgumentError(f"dequant out: need contiguous fp16 [{rows}, {k}], got "
                                             f"{out.dtype} {tuple(out.shape)}")
        if out.data_ptr() % 16:
            raise loader.KernelArgumentError("dequant out: must be 16-byte aligned")
        if w.layout != "tiles":
            raise loader.KernelArgumentError(f"{w.name}: the dequantizer reads the tile layout "
                                             "(app.engine.cuda.layout.to_kernel_layout)")
        if w.bits == 4:
            words = rows * (k // 8)  # threads: one per output word
            args = (w.qa.data_ptr(), w.scales.data_ptr(), out.data_ptr(), np.int64(start), np.int64(words),
                    np.int32(k // 128))
            kernel = self.w4
        else:
            words = rows * (k // 32)  # threads: one per row and 32 inputs
            args = (w.qa.data_ptr(), w.qb.data_ptr(), w.scales.data_ptr(), out.data_ptr(), np.int64(start),
                    np.int64(words), np.int32(k // 128))
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
