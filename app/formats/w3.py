"""W3A16: 3-bit symmetric weights, one fp16 scale per 128 inputs, fp16 activations.

The unsigned value ``u = q + 4`` (0..7) is split into its low 2 bits and its high bit, each
packed in its own int32 tensor (docs/FORMATS.md has the diagrams):

- ``qlow`` int32 [N, K/16]: word j holds k = 16j .. 16j+15; the 2-bit field at bits
  2i..2i+1 holds k = 16j+2i and the one at bits 16+2i.. holds k = 16j+2i+1 (i = 0..7), so
  ``(w >> 2i) & 0x00030003`` is the pair (16j+2i, 16j+2i+1).
- ``qhigh`` int32 [N, K/32]: word j holds k = 32j .. 32j+31; bit i holds the high bit of
  k = 32j+2i and bit 16+i that of k = 32j+2i+1 (i = 0..15), so
  ``((w >> i) & 0x00010001) << 2`` adds the high bits of the same pair.
- ``scales`` fp16 [N, K/128].

A group of 128 is 8 qlow words + 4 qhigh words = 48 bytes: three 16-byte loads.
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

BITS = 3
OFFSET = 4  # stored unsigned u = q + 4


def pack_w3(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed int q [N, K] in [-4, 3] -> (qlow int32 [N, K/16], qhigh int32 [N, K/32])."""
    n, k = q.shape
    if k % 32:
        raise ValueError(f"pack_w3: K={k} is not a multiple of 32")
    if q.numel() and (int(q.min()) < -4 or int(q.max()) > 3):
        raise ValueError("pack_w3: values outside [-4, 3]")
    qlow = torch.empty((n, k // 16), dtype=torch.int32, device=q.device)
    qhigh = torch.empty((n, k // 32), dtype=torch.int32, device=q.device)
    for rows in row_chunks(n, k, DEFAULT_CHUNK_ELEMENTS):  # int64 temporaries of a chunk, not of all of q
        u = q[rows].to(torch.int32) + OFFSET
        qlow[rows], qhigh[rows] = pack_fields(u & 0b11, width=2), pack_fields(u >> 2, width=1)
    return qlow, qhigh


def unpack_w3(qlow: torch.Tensor, qhigh: torch.Tensor) -> torch.Tensor:
    """(qlow [N, K/16], qhigh [N, K/32]) -> signed q int8 [N, K] in [-4, 3]."""
    _check_words(qlow, qhigh)
    u = unpack_fields(qlow, width=2) | (unpack_fields(qhigh, width=1) << 2)
    return (u - OFFSET).to(torch.int8)


def quantize_w3(w: torch.Tensor, scales: torch.Tensor | None = None, *, name: str = "weight",
                chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float W [N, K] -> (qlow [N, K/16], qhigh [N, K/32], scales fp16 [N, K/128]).

    ``scales=None`` uses round-to-nearest scales; see :func:`app.formats.w4.quantize_w4`.
    """
    n, k = check_weight(w, name)
    qlow = torch.empty((n, k // 16), dtype=torch.int32, device=w.device)
    qhigh = torch.empty((n, k // 32), dtype=torch.int32, device=w.device)
    scales_out = torch.empty((n, k // 128), dtype=torch.float16, device=w.device)
    for rows, q, s16 in quantize_to_int(w, scales, BITS, name, chunk_elements):
        qlow[rows], qhigh[rows] = pack_w3(q)
        scales_out[rows] = s16
    return qlow, qhigh, scales_out


def dequantize_w3(qlow: torch.Tensor, qhigh: torch.Tensor, scales: torch.Tensor,
                  dtype: torch.dtype = torch.float32,
                  chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> torch.Tensor:
    """(qlow, qhigh, scales) -> W [N, K] in ``dtype`` (q * scale in fp32)."""
    n, k = _check_triple(qlow, qhigh, scales)
    out = torch.empty((n, k), dtype=dtype, device=qlow.device)
    for rows in row_chunks(n, k, chunk_elements):
        out[rows] = dequantize_int(unpack_w3(qlow[rows], qhigh[rows]), scales[rows], dtype)
    return out


def w3_matmul_ref(x: torch.Tensor, qlow: torch.Tensor, qhigh: torch.Tensor,
                  scales: torch.Tensor) -> torch.Tensor:
    """Reference ``x @ W.T``: x [..., K] -> fp32 [..., N] (dequantize, then fp32 matmul)."""
    w = dequantize_w3(qlow, qhigh, scales, torch.float32)
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"w3_matmul_ref: x has K={x.shape[-1]}, weight has K={w.shape[1]}")
    return x.float() @ w.T


def embedding_lookup_w3_ref(ids: torch.Tensor, qlow: torch.Tensor, qhigh: torch.Tensor,
                            scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows ``ids`` of a W3 table [vocab, hidden] -> [*ids.shape, hidden] (only those rows)."""
    _check_triple(qlow, qhigh, scales)
    flat = ids.reshape(-1).to(device=qlow.device, dtype=torch.long)
    rows = dequantize_w3(qlow[flat], qhigh[flat], scales[flat], dtype)
    return rows.reshape(*ids.shape, rows.shape[1])


def _check_words(qlow: torch.Tensor, qhigh: torch.Tensor) -> None:
    for t, label in ((qlow, "qlow"), (qhigh, "qhigh")):
        if t.dtype != torch.int32 or t.dim() != 2:
            raise ValueError(f"W3 {label} must be a 2-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
    if qlow.shape[0] != qhigh.shape[0] or qlow.shape[1] != 2 * qhigh.shape[1]:
        raise ValueError(f"W3 qlow {tuple(qlow.shape)} and qhigh {tuple(qhigh.shape)} do not match")


def _check_triple(qlow: torch.Tensor, qhigh: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    _check_words(qlow, qhigh)
    n, k = qlow.shape[0], qlow.shape[1] * 16
    check_k(k, "W3 qlow")
    check_scales(scales, n, k, "W3 scales")
    return n, k
