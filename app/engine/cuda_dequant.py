"""W4/W3 -> fp16 dequantization of weight rows in one CUDA kernel (the GEMM prefill's tiles).

One thread per packed word: W4 reads 4 bytes and writes 8 fp16 (one 16-byte store), W3 reads
one qhigh word and its two qlow words and writes 32 fp16. ``fp16(q * scale)`` with the
product exact in fp32 and one rounding: bit-equal to app.quant and to the PyTorch path of
app.engine.runtime_weights, which is the fallback when this does not compile.

Compiled with NVRTC through CuPy like app/kernels (raw fp16 bits, no headers) and launched
on PyTorch's current stream through app.kernels.loader.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from app.engine.runtime_weights import LinearWeight
from app.kernels import loader

THREADS = 256

SOURCE = r"""
typedef unsigned short half_t;

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned f2h(float f) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return (unsigned)h;
}

// Pair (k, k+1) of a word: the even k sits in the low half-word, the odd one in the high.
__device__ __forceinline__ unsigned pair(int even, int odd, int offset, float s) {
    return f2h((float)(even - offset) * s) | (f2h((float)(odd - offset) * s) << 16);
}

// qweight [R, K/8] -> out [R, K] fp16; thread i = word i (k = 8j .. 8j+7 of its row).
extern "C" __global__ void dequant_w4_kernel(const unsigned* __restrict__ qweight,
                                             const half_t* __restrict__ scales,
                                             half_t* __restrict__ out, long long words, int words_per_row) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= words) return;
    const long long row = i / words_per_row;
    const int j = (int)(i - row * words_per_row);
    const unsigned w = qweight[i];
    const float s = h2f(scales[row * (words_per_row / 16) + j / 16]);
    unsigned v[4];
#pragma unroll
    for (int m = 0; m < 4; ++m)  // nibble m: k = 8j + 2m; nibble 4 + m: k = 8j + 2m + 1
        v[m] = pair((w >> (4 * m)) & 15, (w >> (16 + 4 * m)) & 15, 8, s);
    reinterpret_cast<uint4*>(out)[i] = make_uint4(v[0], v[1], v[2], v[3]);
}

// qlow [R, K/16], qhigh [R, K/32] -> out [R, K]; thread i = qhigh word i (k = 32j .. 32j+31).
extern "C" __global__ void dequant_w3_kernel(const unsigned* __restrict__ qlow,
                                             const unsigned* __restrict__ qhigh,
                                             const half_t* __restrict__ scales,
                                             half_t* __restrict__ out, long long words, int words_per_row) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= words) return;
    const long long row = i / words_per_row;
    const int j = (int)(i - row * words_per_row);
    const unsigned hw = qhigh[i];
    const unsigned low[2] = {qlow[2 * i], qlow[2 * i + 1]};
    const float s = h2f(scales[row * (words_per_row / 4) + j / 4]);
    unsigned v[16];
#pragma unroll
    for (int m = 0; m < 16; ++m) {  // pair k = 32j + 2m, +1
        const unsigned lw = low[m >> 3];
        const int f = 2 * (m & 7);
        const int even = ((lw >> f) & 3) | (((hw >> m) & 1) << 2);
        const int odd = ((lw >> (16 + f)) & 3) | (((hw >> (16 + m)) & 1) << 2);
        v[m] = pair(even, odd, 4, s);
    }
    uint4* dst = reinterpret_cast<uint4*>(out) + 4 * i;
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = make_uint4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}
"""


@functools.lru_cache(maxsize=None)
def _kernels(device_index: int):
    import cupy

    with cupy.cuda.Device(device_index):
        try:
            module = cupy.RawModule(code=SOURCE, options=loader.COMPILE_OPTIONS)
            return module.get_function("dequant_w4_kernel"), module.get_function("dequant_w3_kernel")
        except cupy.cuda.compiler.CompileException as e:
            raise loader.KernelCompileError(f"NVRTC failed on the dequantization kernels: {e}") from e


class DequantKernel:
    """``kernel(w, start, stop, out)``: rows start..stop-1 of a packed weight into ``out`` [R, K] fp16."""

    def __init__(self, device: torch.device):
        loader.require()
        self.w4, self.w3 = _kernels(device.index if device.index is not None else torch.cuda.current_device())

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
