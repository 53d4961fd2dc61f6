"""W4A16: 4-bit symmetric weights, one fp16 scale per 128 inputs, fp16 activations.

Layout (docs/FORMATS.md has the bit diagram and a worked example):

- ``qweight`` int32 [N, K/8], row-major. Word j of a row holds k = 8j .. 8j+7 as unsigned
  nibbles ``u = q + 8``; nibble i (bits 4i..4i+3) holds k = 8j + perm4[i],
  perm4 = [0, 2, 4, 6, 1, 3, 5, 7]. So ``((w >> 4i) & 0x000F000F) | 0x64006400`` is the
  half2 ``(1024 + u[8j+2i], 1024 + u[8j+2i+1])`` for i = 0..3.
- ``scales`` fp16 [N, K/128].

All functions are pure (no modules); they work on CPU or CUDA tensors.
"""

from __future__ import annotations

import torch

from app.formats.core import (
    DEFAULT_CHUNK_ELEMENTS,
    check_k,
    check_scales,
    check_weight,
    dequantize_int,
    pack_fields,
    quantize_to_int,
    row_chunks,
    unpack_fields,
)

BITS = 4
OFFSET = 8  # stored unsigned u = q + 8
PERM4 = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds k = 8j + PERM4[i]


def pack_w4(q: torch.Tensor) -> torch.Tensor:
    """Signed int q [N, K] in [-8, 7] -> qweight int32 [N, K/8]."""
    n, k = q.shape
    if k % 8:
        raise ValueError(f"pack_w4: K={k} is not a multiple of 8")
    if q.numel() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError("pack_w4: values outside [-8, 7]")
    out = torch.empty((n, k // 8), dtype=torch.int32, device=q.device)
    for rows in row_chunks(n, k, DEFAULT_CHUNK_ELEMENTS):  # int64 temporaries of a chunk, not of all of q
        out[rows] = pack_fields(q[rows].to(torch.int32) + OFFSET, width=4)
    return out


def unpack_w4(qweight: torch.Tensor) -> torch.Tensor:
    """qweight int32 [N, K/8] -> signed q int8 [N, K] in [-8, 7]."""
    _check_qweight(qweight)
    return (unpack_fields(qweight, width=4) - OFFSET).to(torch.int8)


def quantize_w4(w: torch.Tensor, scales: torch.Tensor | None = None, *, name: str = "weight",
                chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Float W [N, K] -> (qweight int32 [N, K/8], scales fp16 [N, K/128]).

    ``scales=None`` uses round-to-nearest scales (no clipping); pass the result of
    :func:`app.quant.search.search_scales` for the clipping-searched ones. K must be a
    multiple of 128 (:class:`~app.errors.QwenTrayError` naming ``name`` otherwise). Rows are
    processed in chunks so the fp32 temporaries stay bounded for huge embeddings.
    """
    n, k = check_weight(w, name)
    qweight = torch.empty((n, k // 8), dtype=torch.int32, device=w.device)
    scales_out = torch.empty((n, k // 128), dtype=torch.float16, device=w.device)
    for rows, q, s16 in quantize_to_int(w, scales, BITS, name, chunk_elements):
        qweight[rows] = pack_w4(q)
        scales_out[rows] = s16
    return qweight, scales_out


def dequantize_w4(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32,
                  chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> torch.Tensor:
    """(qweight [N, K/8], scales [N, K/128]) -> W [N, K] in ``dtype`` (q * scale in fp32)."""
    n, k = _check_pair(qweight, scales)
    out = torch.empty((n, k), dtype=dtype, device=qweight.device)
    for rows in row_chunks(n, k, chunk_elements):
        out[rows] = dequantize_int(unpack_w4(qweight[rows]), scales[rows], dtype)
    return out


def w4_matmul_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Reference ``x @ W.T``: x [..., K] -> fp32 [..., N], dequantized and multiplied in fp32.

    This is what the CUDA GEMV/GEMM kernels are checked against.
    """
    w = dequantize_w4(qweight, scales, torch.float32)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"w4_matmul_ref: x has K={x.shape[-1]}, weight has K={w.shape[1]}")
    return x.float() @ w.T


def embedding_lookup_ref(ids: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows ``ids`` (any shape) of a W4 embedding table [vocab, hidden] -> [*ids.shape, hidden].

    Only the looked-up rows are unpacked: a 152k-row table is never dequantized whole.
    """
    _check_pair(qweight, scales)
    flat = ids.reshape(-1).to(device=qweight.device, dtype=torch.long)
    rows = dequantize_w4(qweight[flat], scales[flat], dtype)  # [len(flat), hidden]
    return rows.reshape(*ids.shape, rows.shape[1])


def _check_qweight(qweight: torch.Tensor) -> None:
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"W4 qweight must be a 2-D int32 tensor, got {qweight.dtype} {tuple(qweight.shape)}")


def _check_pair(qweight: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    _check_qweight(qweight)
    n, k = qweight.shape[0], qweight.shape[1] * 8
    check_k(k, "W4 qweight")
    check_scales(scales, n, k, "W4 scales")
    return n, k
