"""The fused q/k/v projection with RoPE and the KV-cache write in its epilogue (gemv.cu, EPI_ROPE).

``qkv_rope_w4`` / ``qkv_rope_w3`` = :func:`~app.kernels.gemv.gemv_w4` (optionally with the
layer's RMSNorm and the q/k/v bias) followed by :func:`~app.kernels.norm_rope.rope_kv_write`,
in one launch and bit-equal to the two: each block owns rows i and i + D/2 of one head, so
the rotation pairs meet in the epilogue. The rotated q goes to ``q_out`` [M, Hq, D]; k and v
go to the caches at (slot, kv head, position); the projection itself is never written.
"""

from __future__ import annotations

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_optional, check_range, check_tensor, ensure_output
from app.kernels.gemv import (
    EPI_ROPE, MAX_BATCH, GemvConfig, RmsNorm, _allow_shared, _check_w3, _check_w4, _norm_args, _sm_count, _Weights,
    SOURCE, default_gemv_config,
)
from app.kernels.loader import KernelArgumentError
from app.kernels.norm_rope import check_rope_args


def qkv_rope_w4(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                num_q_heads: int, num_kv_heads: int, bias: torch.Tensor | None = None, norm: RmsNorm | None = None,
                q_out: torch.Tensor | None = None, config: GemvConfig | None = None) -> torch.Tensor:
    """x [M, K] @ W4 [(Hq + 2 Hkv) D, K]^T (+ bias), RoPE, KV write -> rotated q [M, Hq, D].

    Arguments as :func:`app.kernels.rope_kv_write` (cos/sin fp32 [P, >= D/2], positions and
    slots int32 [M] on the GPU, caches [S, Hkv, L, D]); out-of-range rows write nothing.
    """
    return _run(_check_w4(qweight, scales), x, cos, sin, positions, slots, k_cache, v_cache, num_q_heads,
                num_kv_heads, bias, norm, q_out, config)


def qkv_rope_w3(x: torch.Tensor, qlow: torch.Tensor, qhigh: torch.Tensor, scales: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, *, num_q_heads: int, num_kv_heads: int, bias: torch.Tensor | None = None,
                norm: RmsNorm | None = None, q_out: torch.Tensor | None = None,
                config: GemvConfig | None = None) -> torch.Tensor:
    """Like :func:`qkv_rope_w4` for the W3 layout."""
    return _run(_check_w3(qlow, qhigh, scales), x, cos, sin, positions, slots, k_cache, v_cache, num_q_heads,
                num_kv_heads, bias, norm, q_out, config)


def _run(w: _Weights, x, cos, sin, positions, slots, k_cache, v_cache, hq: int, hkv: int, bias, norm, q_out,
         config: GemvConfig | None) -> torch.Tensor:
    dev = w.qa.device
    check_tensor("x", x, torch.float16, (None, w.k), device=dev)
    m = check_range("batch (x.shape[0])", x.shape[0], 1, MAX_BATCH)
    d, slots_n, max_len = check_rope_args(w.rows, m, cos, sin, positions, slots, k_cache, v_cache,
                                          num_q_heads=hq, num_kv_heads=hkv, device=dev)
    if d % 32:
        raise KernelArgumentError(f"head_dim={d} must be a multiple of 32 for the fused q/k/v + RoPE kernel")
    bias_ptr = check_optional("bias", bias, torch.float16, (w.rows,), device=dev, aligned=False)
    norm_ptr, eps, shared = _norm_args(norm, w.k, m, dev)
    q = ensure_output("q_out", q_out, (m, hq, d), torch.float16, dev)
    pairs = w.rows // 2  # outputs are computed in (i, i + D/2) pairs: like the gated kernel's (gate, up)
    cfg = config or default_gemv_config(pairs, w.k, True, _sm_count(dev))
    if cfg.out_rows_per_block(True) != 16:
        raise KernelArgumentError(f"{cfg} owns {cfg.out_rows_per_block(True)} pairs per block; the fused RoPE "
                                  "kernel needs 16 (tiles=1 with an even number of warps, or tiles=2)")
    kernel = loader.get_kernel(SOURCE, cfg.name_expression(w.bits, True, norm is not None, epilogue=EPI_ROPE))
    _allow_shared(kernel, shared, dev)
    qb_ptr = w.qb.data_ptr() if w.qb is not None else 0
    i32 = np.int32
    args = (w.qa.data_ptr(), qb_ptr, w.scales.data_ptr(), x.data_ptr(), norm_ptr, eps, bias_ptr, 0, 0,
            i32(m), i32(w.rows), i32(w.k),
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            positions.data_ptr(), slots.data_ptr(), i32(hq), i32(hkv), i32(d), i32(cos.shape[0]),
            i32(cos.stride(0)), i32(max_len), i32(slots_n))
    loader.launch(kernel, (pairs // 16,), (32 * cfg.warps,), args, shared_mem=shared)
    return q
