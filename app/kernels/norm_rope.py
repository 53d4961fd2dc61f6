"""Launchers for RMSNorm (norm.cu) and RoPE + KV-cache write (rope.cu)."""

from __future__ import annotations

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_multiple, check_range, check_tensor, ensure_output, no_overlap

MAX_NORM_THREADS = 1024
MAX_NORM_HIDDEN = 16384  # norm.cu NORM_MAX_CHUNKS chunks of 16


def norm_block_size(hidden: int) -> int:
    """Threads per row: one 8-value vector each, a multiple of 32, at most 1024."""
    vectors = hidden // 8
    return min(MAX_NORM_THREADS, max(32, (vectors + 31) // 32 * 32))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, residual: torch.Tensor | None = None,
             out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    """RMSNorm of x [rows, H] fp16 (HF rounding). Returns y, or (y, h) when ``residual`` is given.

    With ``residual``: h = x + residual is written to ``residual_out`` (default: a new tensor;
    pass ``residual`` itself to update it in place) and y = RMSNorm(h).
    """
    loader.require()
    check_tensor("x", x, torch.float16, (None, None))
    rows, hidden = x.shape
    check_multiple("hidden size", hidden, 8)
    check_range("hidden size", hidden, 8, MAX_NORM_HIDDEN)
    dev = x.device
    check_tensor("weight", weight, torch.float16, (hidden,), device=dev)
    y = ensure_output("out", out, (rows, hidden), torch.float16, dev)
    no_overlap("x", x, "out", y)
    res_ptr = res_out_ptr = 0
    if residual is not None:
        check_tensor("residual", residual, torch.float16, (rows, hidden), device=dev)
        residual_out = ensure_output("residual_out", residual_out, (rows, hidden), torch.float16, dev)
        for name, t in (("x", x), ("out", y)):
            no_overlap(name, t, "residual_out", residual_out)
        if residual_out.data_ptr() != residual.data_ptr():
            no_overlap("residual", residual, "residual_out", residual_out)
        res_ptr, res_out_ptr = residual.data_ptr(), residual_out.data_ptr()
    if rows == 0:
        return (y, residual_out) if residual is not None else y
    kernel = loader.get_kernel("norm.cu", "rms_norm_kernel")
    args = (x.data_ptr(), res_ptr, res_out_ptr, weight.data_ptr(), y.data_ptr(), np.int32(hidden), np.float32(eps))
    loader.launch(kernel, (rows,), (norm_block_size(hidden),), args)
    return (y, residual_out) if residual is not None else y


def rope_kv_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, num_q_heads: int,
                  num_kv_heads: int, q_out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate q and k of the fused projection qkv [T, (Hq + 2 Hkv) D], store k and v.

    cos/sin: fp32 [P, >= D/2] (column i < D/2 = angle of pair i; the engine's [P, D] tables
    fit). positions, slots: int32 [T] on the GPU (graph-friendly: no host sync). Caches:
    fp16 [S, Hkv, L, D]. Returns the rotated q [T, Hq, D]. Out-of-range positions or slots
    write nothing; the caller checks ranges.
    """
    loader.require()
    check_tensor("qkv", qkv, torch.float16, (None, None))
    tokens, width = qkv.shape
    heads = num_q_heads + 2 * num_kv_heads
    if num_q_heads < 1 or num_kv_heads < 1 or width % heads:
        raise loader.KernelArgumentError(
            f"qkv width {width} is not (num_q_heads={num_q_heads} + 2*num_kv_heads={num_kv_heads}) * head_dim")
    head_dim = check_multiple("head_dim", width // heads, 8)
    dev = qkv.device
    check_tensor("k_cache", k_cache, torch.float16, (None, num_kv_heads, None, head_dim), device=dev)
    slots_n, _, max_len, _ = k_cache.shape
    check_tensor("v_cache", v_cache, torch.float16, tuple(k_cache.shape), device=dev)
    check_rope_tables(cos, sin, head_dim, dev)
    check_tensor("positions", positions, torch.int32, (tokens,), device=dev, aligned=False)
    check_tensor("slots", slots, torch.int32, (tokens,), device=dev, aligned=False)
    q = ensure_output("q_out", q_out, (tokens, num_q_heads, head_dim), torch.float16, dev)
    no_overlap("qkv", qkv, "q_out", q)
    if tokens == 0:
        return q
    warps = 4
    blocks = (tokens * heads + warps - 1) // warps
    kernel = loader.get_kernel("rope.cu", "rope_kv_kernel")
    args = (qkv.data_ptr(), q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            positions.data_ptr(), slots.data_ptr(), np.int32(tokens), np.int32(num_q_heads),
            np.int32(num_kv_heads), np.int32(head_dim), np.int32(cos.shape[0]), np.int32(cos.stride(0)),
            np.int32(max_len), np.int32(slots_n))
    loader.launch(kernel, (blocks,), (32 * warps,), args)
    return q


def check_rope_tables(cos: torch.Tensor, sin: torch.Tensor, head_dim: int, device, *,
                      vector_loads: bool = False) -> None:
    """cos/sin: fp32 [P, >= D/2], the same shape, on ``device``. ``vector_loads``: the kernel
    reads a row's angles 16 bytes at a time (aligned rows of a multiple of 4 floats)."""
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[1] < head_dim // 2:
            raise loader.KernelArgumentError(f"{name}: shape must be [positions, >= {head_dim // 2}], got {list(t.shape)}")
        check_tensor(name, t, torch.float32, tuple(cos.shape), device=device, aligned=vector_loads)
    if vector_loads:
        check_multiple("rope table row length", cos.shape[1], 4)
