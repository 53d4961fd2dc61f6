"""W4/W3 -> fp16 dequantization of weight rows in one CUDA kernel (the GEMM prefill's tiles).

One thread per packed word: W4 reads 4 bytes and writes 8 fp16 (one 16-byte store), W3 reads
one qhigh word and its two qlow words and writes 32 fp16. ``fp16(q * scale)`` with the
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
            self.w4 = loader.get_kernel("dequant.cu", "dequant_w4_kernel")
            self.w3 = loader.get_kernel("dequant.cu", "dequant_w3_kernel")

    def __call__(self, w: LinearWeight, start: int, stop: int, out: torch.Tensor) -> torch.Tensor:
        rows, k = stop - start, w.in_features
        if tuple(out.shape) != (rows, k) or out.dtype != torch.float16 or not out.is_contiguous():
            raise loader.KernelArgumentError(f"dequant out: need contiguous fp16 [{rows}, {k}], got "
                                             f"{out.dtype} {tuple(out.shape)}")
        if out.data_ptr() % 16:
            raise loader.KernelArgumentError("dequant out: must be 16-byte aligned")
        scales = w.scales[start:stop]
        if w.bits == 4:
            qweight = w.qa[start:stop]
            words = qweight.numel()
            args = (qweight.data_ptr(), scales.data_ptr(), out.data_ptr(), np.int64(words), np.int32(k // 8))
            kernel = self.w4
        else:
            qlow, qhigh = w.qa[start:stop], w.qb[start:stop]
            words = qhigh.numel()
            args = (qlow.data_ptr(), qhigh.data_ptr(), scales.data_ptr(), out.data_ptr(), np.int64(words),
                    np.int32(k // 32))
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
