"""Shared pieces of the W4/W3 formats: groups, scales, bit-field packing.

Every quantized weight is ``W [N rows = out_features, K = in_features]`` cut into groups of
``GROUP_SIZE`` consecutive values along K. Each (row, group) has one fp16 scale and the
values are symmetric integers ``q`` in ``[-2^(b-1), 2^(b-1) - 1]`` so ``W ~= q * scale``.

The packing helpers here put ``width``-bit fields into int32 words with the "even k's in the
low half-word, odd k's in the high half-word" order that both layouts use (see
docs/FORMATS.md): one shift and one mask then isolate the pair ``(k, k+1)`` as the two
halves of a ``half2`` on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from app.errors import QwenTrayError

GROUP_SIZE = 128

# Smallest positive fp16 (subnormal 2^-24): a group of zeros (or of values too small for
# fp16) still gets a non-zero scale, so quantizing never divides by zero.
FP16_TINY = 2.0**-24
FP16_MAX = 65504.0

# Rows per chunk are chosen so the fp32 temporaries of one chunk stay near this many
# elements (~4 MiB each, cache friendly): a 152k x 3584 embedding is ~520 slices.
DEFAULT_CHUNK_ELEMENTS = 1 << 20


def qrange(bits: int) -> tuple[int, int]:
    """Symmetric signed range of a ``bits``-bit value: (-8, 7) for 4, (-4, 3) for 3."""
    if bits not in (3, 4):
        raise ValueError(f"bits must be 3 or 4, got {bits}")
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def check_weight(w: torch.Tensor, name: str) -> tuple[int, int]:
    """Validate a weight to quantize and return (N, K); K must be a multiple of 128."""
    if w.dim() != 2:
        raise QwenTrayError(f"{name}: can only quantize a 2-D weight, got shape {tuple(w.shape)}")
    if not w.is_floating_point():
        raise QwenTrayError(f"{name}: weight must be floating point, got {w.dtype}")
    n, k = w.shape
    check_k(k, name)
    if n == 0:
        raise QwenTrayError(f"{name}: weight has no rows")
    return n, k


def check_k(k: int, name: str) -> None:
    """K (in_features) must split into whole groups; no padding is done anywhere."""
    if k <= 0 or k % GROUP_SIZE != 0:
        raise QwenTrayError(
            f"{name}: in_features K={k} is not a multiple of {GROUP_SIZE} "
            f"(quantized groups are {GROUP_SIZE} wide; keep this tensor at 16 bits in the recipe)"
        )


def row_chunks(n_rows: int, k: int, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> Iterator[slice]:
    """Row slices whose size keeps ``rows * k`` near ``chunk_elements`` (at least one row)."""
    rows = max(1, chunk_elements // max(k, 1))
    for start in range(0, n_rows, rows):
        yield slice(start, min(start + rows, n_rows))


def grouped(w: torch.Tensor) -> torch.Tensor:
    """[R, K] -> [R, K/128, 128] float32 view/copy for per-group math."""
    r, k = w.shape
    return w.float().reshape(r, k // GROUP_SIZE, GROUP_SIZE)


def rtn_scales_fp32(wg: torch.Tensor, bits: int) -> torch.Tensor:
    """Round-to-nearest scales of grouped weights [R, G, 128] -> [R, G] fp32.

    Uses both ends of the signed range: ``max(pos_max / qmax, neg_max / (qmax + 1))``, so the
    group's largest positive value lands on ``qmax`` or its most negative value on
    ``qmin = -(qmax + 1)`` and nothing is clipped. This is never larger than the textbook
    ``absmax / qmax`` and makes the extra negative level useful.
    """
    qmin, qmax = qrange(bits)
    pos = wg.amax(dim=-1).clamp(min=0.0)
    neg = (-wg).amax(dim=-1).clamp(min=0.0)
    return torch.maximum(pos / qmax, neg / -qmin)


def to_fp16_scales(scales: torch.Tensor, name: str) -> torch.Tensor:
    """Round fp32 scales to the stored fp16, keeping them positive and finite."""
    if not bool(torch.isfinite(scales).all()):
        raise QwenTrayError(f"{name}: weight contains NaN or Inf")
    if bool((scales > FP16_MAX).any()):
        raise QwenTrayError(f"{name}: weights too large for fp16 scales (a group scale exceeds {FP16_MAX})")
    return scales.clamp(min=FP16_TINY).half()


def quantize_groups(wg: torch.Tensor, scales16: torch.Tensor, bits: int) -> torch.Tensor:
    """Grouped weights [R, G, 128] and fp16 scales [R, G] -> int8 q [R, G, 128].

    The division uses the fp16 scale widened to fp32: exactly what the dequantizer and the
    kernels multiply by, so the chosen q is the nearest level for the stored scale.
    """
    qmin, qmax = qrange(bits)
    s = scales16.float().unsqueeze(-1)
    return torch.round(wg / s).clamp_(qmin, qmax).to(torch.int8)


def check_scales(scales: torch.Tensor, n: int, k: int, name: str) -> None:
    if scales.dtype != torch.float16 or tuple(scales.shape) != (n, k // GROUP_SIZE):
        raise QwenTrayError(
            f"{name}: scales must be float16 of shape {(n, k // GROUP_SIZE)}, "
            f"got {scales.dtype} {tuple(scales.shape)}"
        )
    if not bool(torch.isfinite(scales).all()) or bool((scales <= 0).any()):
        raise QwenTrayError(f"{name}: scales must be finite and > 0")


def quantize_to_int(w: torch.Tensor, scales: torch.Tensor | None, bits: int, name: str,
                    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """Yield (row slice, q int8 [R, K], fp16 scales [R, K/128]) chunk by chunk.

    ``scales=None`` computes round-to-nearest scales; given scales are used as they are.
    """
    n, k = check_weight(w, name)
    if scales is not None:
        check_scales(scales, n, k, name)
    for rows in row_chunks(n, k, chunk_elements):
        wg = grouped(w[rows])
        if not bool(torch.isfinite(wg).all()):
            raise QwenTrayError(f"{name}: weight contains NaN or Inf")
        s16 = to_fp16_scales(rtn_scales_fp32(wg, bits), name) if scales is None else scales[rows].to(wg.device)
        q = quantize_groups(wg, s16, bits)
        yield rows, q.reshape(q.shape[0], k), s16


def dequantize_int(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q int [R, K] * fp16 scales [R, K/128] (math in fp32) -> [R, K] ``dtype``."""
    r, k = q.shape
    qg = q.float().reshape(r, k // GROUP_SIZE, GROUP_SIZE)  # [R, G, 128]
    return (qg * scales.float().unsqueeze(-1)).reshape(r, k).to(dtype)


# -- bit-field packing ---------------------------------------------------------------------

def even_odd_order(n_fields: int) -> list[int]:
    """Field f of a word holds value ``order[f]`` of its span: evens first, then odds.

    For 8 nibbles this is [0, 2, 4, 6, 1, 3, 5, 7] (perm4); for 16 two-bit fields
    [0, 2, ..., 14, 1, 3, ..., 15]; for 32 one-bit fields [0, 2, ..., 30, 1, ..., 31].
    """
    return list(range(0, n_fields, 2)) + list(range(1, n_fields, 2))


def _to_int32_words(words64: torch.Tensor) -> torch.Tensor:
    """Reinterpret unsigned 32-bit values held in int64 as int32 (two's complement)."""
    signed = torch.where(words64 >= 2**31, words64 - 2**32, words64)
    return signed.to(torch.int32)


def pack_fields(u: torch.Tensor, width: int) -> torch.Tensor:
    """Unsigned fields u [R, K] (each < 2^width) -> int32 words [R, K * width / 32].

    Word j holds the span k = F*j .. F*j + F - 1 (F = 32 / width fields per word); field f
    (bits width*f ..) holds k = F*j + even_odd_order(F)[f].
    """
    per_word = 32 // width
    r, k = u.shape
    spans = u.to(torch.int64).reshape(r, k // per_word, per_word)  # [R, words, F] in k order
    fields = spans[..., even_odd_order(per_word)]  # field f <- value order[f]
    shifts = torch.arange(per_word, dtype=torch.int64, device=u.device) * width
    words = (fields << shifts).sum(dim=-1)  # fields never overlap, so sum == bitwise or
    return _to_int32_words(words)


def unpack_fields(words: torch.Tensor, width: int) -> torch.Tensor:
    """Inverse of :func:`pack_fields`: int32 words [R, W] -> unsigned int32 fields [R, W*F]."""
    per_word = 32 // width
    r, n_words = words.shape
    inverse = [0] * per_word  # k offset -> the field holding it
    for f, pos in enumerate(even_odd_order(per_word)):
        inverse[pos] = f
    # each k's field shifted down directly (k order: no gather pass over the [R, W, F] result)
    shifts = torch.tensor(inverse, dtype=torch.int32, device=words.device) * width
    mask = (1 << width) - 1
    fields = words.unsqueeze(-1) >> shifts  # [R, W, F]
    fields &= mask  # (in place: a new tensor per pass costs its page faults) arithmetic shift masked off
    return fields.reshape(r, n_words * per_word)


def padded_k(k: int) -> int:
    """Stored K of a quantized weight: K rounded up to whole groups of 128 (the quantizer
    zero-pads the missing columns; they quantize to 0)."""
    return -(-k // GROUP_SIZE) * GROUP_SIZE


def quantized_nbytes(n: int, k: int, bits: int) -> int:
    """Bytes of an [N, K] weight in format ``bits``: packed values plus fp16 scales."""
    check_k(k, "weight")
    return n * k * bits // 8 + n * (k // GROUP_SIZE) * 2
