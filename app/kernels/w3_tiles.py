"""W3 "tiles" layout: how the GPU holds 3-bit weights (repacked at load time, same bytes).

The checkpoint's W3 layout (docs/FORMATS.md: ``qlow`` 2-bit fields + ``qhigh`` bit planes)
never puts a 3-bit value where the GEMV can turn it into fp16 without shifting it first,
which made the W3 GEMV instruction-bound (5 instructions per pair of weights). On the GPU
every W3 weight is repacked, in place, into the same two tensors ``a`` int32 [N, K/16] and
``b`` int32 [N, K/32] holding this layout instead (when N is not a multiple of 16, new
tensors of ``padded_rows(N)`` rows whose extra rows are zeros; the scales stay [N, K/128]):

A tile is 16 rows x one group of 128 inputs; the GEMV's lane ``l = 4g + t`` reads rows g
and g + 8 of the tile, inputs 32t .. 32t + 31 of the group (app/kernels/gemv.cu), and its
bytes sit next to its neighbours' so a warp's loads are two fully used, contiguous spans::

    a: [N/16 tiles][K/128 groups][32 lanes][4 words] = row g: W0 W1, row g + 8: W0 W1
    b: [N/16 tiles][K/128 groups][32 lanes][2 words] = row g: W2,    row g + 8: W2

(tile-major, so tiles t0..t1 of ``a`` occupy exactly the bytes of rows 16 t0 .. 16 t1 of a
[N, K/16] tensor: the repack works in place, chunk by chunk.) A row's 32 inputs are 16
pairs ``p`` = (k, k + 1), k = 32t + 2p; the even k lives in the low 16 bits of a word, the
odd one in the high 16 bits, at the same place::

    bit of each half-word:  15 | 14 13 12 | 11 10 9 | 8 7 6 | 5 4 3 | 2 1 0
    W0                      b0 |  pair 4  | pair 3  | pair 2| pair 1| pair 0
    W1                      b1 |  pair 9  | pair 8  | pair 7| pair 6| pair 5
    W2                      b2 |  pair 14 | pair 13 | p. 12 | p. 11 | pair 10
    pair 15 = b2 b1 b0 (its three bits are the three sign bits)

Each field holds ``u = q + 4`` (0..7). Fields at bits 0, 3 and 6 become fp16 with one LOP3
into the magic number 0x6400 (1024 + u, 1024 + 8u, 1024 + 64u) and one f16x2 sub/fma; 9
and 12 after one shift shared by both; pair 15 from the three sign bits of +-1024 with
three fma. About 2.4 instructions per pair instead of 5, and the same 12 bytes per row.

Pure PyTorch, any device, no host synchronisation (usable inside a CUDA graph capture).
"""

from __future__ import annotations

import torch

from app.formats.w3 import OFFSET, pack_w3, unpack_w3
from app.kernels.tiles import GROUP, TILE_ROWS, check_tileable, padded_rows, repack_in_place

PAIRS_PER_WORD = 5  # pairs 0..14 in W0..W2; pair 15 in the sign bits


def _words_from_values(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsigned values u [N, K] (0..7, any integer dtype) -> (a [N, K/16], b [N, K/32]) int32."""
    n, k = u.shape
    check_tileable(n, k)
    tiles, groups = n // TILE_ROWS, k // GROUP
    # [tile, h, g, group, t, pair, parity]: row = 16 tile + 8h + g, k = 128 group + 32t + 2 pair + parity
    v = u.to(torch.int64).view(tiles, 2, 8, groups, 4, 16, 2)
    parity_shift = torch.tensor([0, 16], dtype=torch.int64, device=u.device)
    field_shift = 3 * torch.arange(PAIRS_PER_WORD, dtype=torch.int64, device=u.device)[:, None] + parity_shift
    words = []
    for i in range(3):
        fields = v[..., PAIRS_PER_WORD * i:PAIRS_PER_WORD * (i + 1), :]  # [..., 5, 2]
        w = (fields << field_shift).sum(dim=(-2, -1))
        w = w | (((v[..., 15, :] >> i) & 1) << (15 + parity_shift)).sum(dim=-1)  # bit i of pair 15
        words.append(w)  # [tile, h, g, group, t]
    as_int32 = [torch.where(w >= 2**31, w - 2**32, w).to(torch.int32) for w in words]
    # lane l = 4g + t: a holds (W0, W1) of row g then of row g + 8; b holds W2 of each.
    a = torch.stack(as_int32[:2], dim=-1)  # [tile, h, g, group, t, 2]
    a = a.permute(0, 3, 2, 4, 1, 5).reshape(n, k // 16)  # [tile, group, g, t, h, word]
    b = as_int32[2].permute(0, 3, 2, 4, 1).reshape(n, k // 32)  # [tile, group, g, t, h]
    return a.contiguous(), b.contiguous()


def repack_w3_tiles(qlow: torch.Tensor, qhigh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint W3 (qlow [N, K/16], qhigh [N, K/32]) -> tile layout (a, b), new tensors of
    ``padded_rows(N)`` rows (the padding rows hold u = 0; their scales do not exist)."""
    u = unpack_w3(qlow, qhigh).to(torch.int32) + OFFSET
    n = u.shape[0]
    if n % TILE_ROWS:
        u = torch.cat([u, u.new_zeros((padded_rows(n) - n, u.shape[1]))])
    return _words_from_values(u)


def repack_w3_tiles_(qlow: torch.Tensor, qhigh: torch.Tensor) -> None:
    """:func:`repack_w3_tiles` into the same two tensors, a chunk of tiles at a time."""
    repack_in_place((qlow, qhigh), qlow.shape[1] * 16, repack_w3_tiles)


def tile_values(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Unsigned values u (0..7) of rows ``rows`` (int64 [R], any order) -> uint8 [R, K] in k order."""
    n, groups = a.shape[0], a.shape[1] // 8
    dev = a.device
    tile, slot = rows // TILE_ROWS, rows % TILE_ROWS
    g, h = slot % 8, slot // 8
    w01 = a.view(n // TILE_ROWS, groups, 8, 4, 2, 2)[tile, :, g, :, h]  # [R, group, t, (W0, W1)]
    w2 = b.view(n // TILE_ROWS, groups, 8, 4, 2)[tile, :, g, :, h]  # [R, group, t] (advanced indices first)
    words = torch.cat([w01, w2[..., None]], dim=-1)  # [R, group, t, 3] int32
    parity_shift = 16 * torch.arange(2, device=dev, dtype=torch.int32)
    field_shift = 3 * torch.arange(PAIRS_PER_WORD, device=dev, dtype=torch.int32)[:, None] + parity_shift  # [5, 2]
    # u[R, group, t, pair, parity]: k = 128 group + 32t + 2 pair + parity. One word at a time
    # (the prefill's fallback dequantizer runs this on big row tiles: < 4 bytes per weight live).
    u = torch.empty((*words.shape[:-1], 16, 2), dtype=torch.uint8, device=dev)
    last = torch.zeros((*words.shape[:-1], 2), dtype=torch.int32, device=dev)
    for i in range(3):
        w = words[..., i, None, None]  # [R, group, t, 1, 1]
        # arithmetic >> on int32 is fine: every field is masked after the shift
        u[..., PAIRS_PER_WORD * i:PAIRS_PER_WORD * (i + 1), :] = (w >> field_shift).bitwise_and_(7)
        last |= ((w[..., 0] >> (15 + parity_shift)) & 1) << i  # its sign bits: bit i of pair 15
    u[..., 15, :] = last
    return u.view(rows.shape[0], groups * GROUP)


def unpack_w3_tiles(a: torch.Tensor, b: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile layout (a, b) -> checkpoint layout (qlow, qhigh) of the first ``n`` rows (default
    all): the inverse of :func:`repack_w3_tiles`."""
    rows = torch.arange(a.shape[0] if n is None else n, device=a.device)
    q = tile_values(a, b, rows).to(torch.int32) - OFFSET
    return pack_w3(q)
