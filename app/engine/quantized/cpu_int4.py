"""The CPU's quantized backend: W4 and W3 weights kept at 4 bits, multiplied by PyTorch's int4 kernel.

The dense backend (modules.use_dense_backend) dequantizes every weight once at load: the
reference the GPU kernels are held to, but on a CPU that holds and reads 16 bits per weight
(the 7B: 14 GiB of bfloat16, more than many laptops have). This backend repacks each weight's
codes for ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (PyTorch's CPU int4 kernel, group 128,
bfloat16 activations) and keeps them at 4 bits: a quarter of the memory traffic per token.

The mapping: the kernel computes w = (u - 8) * scale + zero per group with u in 0..15. A W4
code q in [-8, 7] is u = q + 8; a W3 code q in [-4, 3] is u = q + 8 too (inside 4..11); zero
is 0. So the codes are the checkpoint's own; the fp16 scales are rounded to bfloat16 (the
kernel takes them in the activations' type), which moves a weight by at most 2^-9 of itself,
as the dense backend's bfloat16 weights do.

Used for bfloat16 on the CPU when the kernel is there and passes a small self-check
(:func:`available`; its packing and signature changed across PyTorch versions), else the
dense backend. The embedding's rows are looked up from its packed codes (only those rows).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from app.formats.core import GROUP_SIZE, unpack_fields
from app.formats.w3 import OFFSET as W3_OFFSET

INNER_K_TILES = 2  # the CPU packing's K blocking (K must be a multiple of 16 * this: 128 is)
ROW_MULTIPLE = 16  # the CPU packing takes N in multiples of 16: pad rows with zero weights
PACK_ROWS = 4096  # rows converted at a time (the conversion takes int32 codes: 4 bytes a weight)
OFFSET = 8  # the kernel's u - 8


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this PyTorch's CPU int4 kernel exists and computes what this module expects."""
    aten = torch.ops.aten
    if not (hasattr(aten, "_weight_int4pack_mm_for_cpu") and hasattr(aten, "_convert_weight_to_int4pack_for_cpu")):
        return False
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (32, 2 * GROUP_SIZE), generator=gen, dtype=torch.int32)
    scales = torch.rand((32, 2), generator=gen) / 8 + 0.01
    x = torch.randn((3, 2 * GROUP_SIZE), generator=gen)
    try:
        packed, scales_zeros = pack_codes(q, scales.half(), torch.bfloat16)
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, GROUP_SIZE, scales_zeros).float()
    except (RuntimeError, NotImplementedError):  # the op exists but not for these arguments
        return False
    want = x.bfloat16().float() @ (q.float() * scales.half().float().repeat_interleave(GROUP_SIZE, 1)).T
    return bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max())))


def pack_codes(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Signed codes q [N, K] (W4 or W3) and fp16 scales [N, K/128] -> (the kernel's packed weight,
    scales_and_zeros [K/128, N', 2] in ``dtype``), N' = N rounded up to 16 (zero rows)."""
    return _pack(lambda rows: q[rows].to(torch.int32) + OFFSET, q.shape[0], q.shape[1], scales, dtype)


def pack_module(module, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pack_codes` of a QuantLinear, its codes unpacked PACK_ROWS rows at a time: unpacked
    whole, a 3B's embedding passes through gigabytes of int32 temporaries."""
    return _pack(lambda rows: kernel_codes(module, rows), module.out_features, module.padded_in_features,
                 module.scales, dtype)


def _pack(codes, n: int, k: int, scales: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    pad = -n % ROW_MULTIPLE
    parts = []
    for start in range(0, n, PACK_ROWS):  # a multiple of 64 rows: chunks pack like the whole
        rows = codes(slice(start, start + PACK_ROWS))  # u = q + 8, int32
        if start + PACK_ROWS >= n and pad:
            rows = torch.cat([rows, torch.full((pad, k), OFFSET, dtype=torch.int32)])
        parts.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(rows.contiguous(), INNER_K_TILES))
    s = F.pad(scales.to(dtype), (0, 0, 0, pad))  # [N', K/128]
    scales_zeros = torch.stack([s.T, torch.zeros_like(s.T)], dim=-1).contiguous()  # [K/128, N', 2]
    return torch.cat(parts), scales_zeros


def kernel_codes(module, rows: slice) -> torch.Tensor:
    """The kernel's u = q + 8 (int32 [R, K_stored]) of a QuantLinear's ``rows``, from the stored
    fields as they are: W4 stores u = q + 8 itself, W3 u = q + 4."""
    t = module.packed_tensors()
    if module.format == "w4":
        return unpack_fields(t["qweight"][rows], width=4)
    u3 = unpack_fields(t["qlow"][rows], width=2) | (unpack_fields(t["qhigh"][rows], width=1) << 2)
    return u3 + (OFFSET - W3_OFFSET)


def int4_linear(module, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T (+ b): x [..., K] in bfloat16 -> [..., N]."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])  # [M, K]
    if module.padded_in_features != module.in_features:  # the stored K's padding columns meet zeros
        x2 = F.pad(x2, (0, module.padded_in_features - module.in_features))
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2.contiguous(), module.int4_packed, GROUP_SIZE,
                                                   module.int4_scales_zeros)[:, : module.out_features]
    if module.bias is not None:
        y = y + module.bias
    return y.reshape(*lead, module.out_features)


def packed_lookup(module, ids: torch.Tensor) -> torch.Tensor:
    """Embedding rows from the packed table (only the rows asked for are unpacked)."""
    return module.quantized().lookup_rows(ids, module.compute_dtype)[..., : module.embedding_dim]
