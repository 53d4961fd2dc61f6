"""Plain-PyTorch references of every CUDA kernel: the CPU path, and the oracle of the GPU tests.

Each function computes what its kernel computes, with the same fp16 rounding points (the
kernels differ only in fp32 summation order). They run on any device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from app.formats.w3 import dequantize_w3
from app.formats.w4 import dequantize_w4


def rows_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T in fp32 one row at a time: a row's result does not depend on the other rows, as in
    the kernels (BLAS libraries pick other blockings, so other sums, for other row counts: a
    guessed token checked in a 5-row step would otherwise see other logits than one decoded
    alone)."""
    w = weight.float().T  # [K, N]
    return torch.cat([row @ w for row in x.float().split(1)]) if x.shape[0] else x.float() @ w


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None) -> torch.Tensor:
    """fp16(x @ W^T + bias) in fp32, then fp16(y + residual): the unfused PyTorch rounding."""
    y = rows_matmul(x, weight)  # [M, N]
    if bias is not None:
        y = y + bias.float()
    y = y.half()
    if residual is not None:
        y = (y.float() + residual.float()).half()
    return y


def gate_up_silu_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """weight = [gate; up] [2I, K]: fp16(silu(fp16(x Wg^T))) * fp16(x Wu^T) -> [M, I] fp16."""
    gate_up = rows_matmul(x, weight).half()  # [M, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    return (F.silu(gate.float()).half().float() * up.float()).half()


def gemv_w4_ref(x, qweight, scales, bias=None, residual=None) -> torch.Tensor:
    return linear_ref(x, dequantize_w4(qweight, scales, torch.float32), bias, residual)


def gemv_w3_ref(x, qlow, qhigh, scales, bias=None, residual=None) -> torch.Tensor:
    return linear_ref(x, dequantize_w3(qlow, qhigh, scales, torch.float32), bias, residual)


def gate_up_silu_w4_ref(x, qweight, scales) -> torch.Tensor:
    return gate_up_silu_ref(x, dequantize_w4(qweight, scales, torch.float32))


def gate_up_silu_w3_ref(x, qlow, qhigh, scales) -> torch.Tensor:
    return gate_up_silu_ref(x, dequantize_w3(qlow, qhigh, scales, torch.float32))


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """HF's RMSNorm rounding: fp16(w * fp16(h * rsqrt(mean(h^2) + eps))); h = fp16(x + residual).

    Returns y, or (y, h) when ``residual`` is given.
    """
    h = x if residual is None else (x.float() + residual.float()).half()
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).half()
    y = (normed.float() * weight.float()).half()
    return y if residual is None else (y, h)


def norm_chunk_sums_ref(h: torch.Tensor) -> torch.Tensor:
    """[M, H] fp16 (H % 16 == 0) -> [M, H/16] fp32: the chunk sums of squares in common.cu's
    order, bit-exact (fp32 products and sums, no fused multiply-add; eager PyTorch rounds each)."""
    m, hidden = h.shape
    f = h.float().view(m, hidden // 16, 2, 8)  # [M, chunk, half, e]
    p = f[:, :, 0] * f[:, :, 0] + f[:, :, 1] * f[:, :, 1]  # p_e = x[e]^2 + x[e+8]^2: [M, C, 8]
    q = p[..., 0::2] + p[..., 1::2]  # (p0+p1), (p2+p3), ...: [M, C, 4]
    r = q[..., 0::2] + q[..., 1::2]  # [M, C, 2]
    return r[..., 0] + r[..., 1]  # [M, C]


def norm_inv_ref(sums: torch.Tensor, hidden: int, eps: float) -> torch.Tensor:
    """[M, C] chunk sums -> [M, 1] fp32 1/rms as the kernels compute it: lane l of a warp adds
    chunks l, l+32, ... in order, then an xor tree over the 32 lanes; 1 / sqrt(total / H + eps)."""
    m, c = sums.shape
    lanes = torch.zeros(m, -(-c // 32) * 32, dtype=torch.float32)
    lanes[:, :c] = sums.float().cpu()
    lanes = lanes.view(m, -1, 32)  # [M, J, lane]
    s = lanes[:, 0]
    for j in range(1, lanes.shape[1]):
        s = s + lanes[:, j]
    while s.shape[1] > 1:  # off = 16, 8, 4, 2, 1: lane l < off gets s_l + s_(l + off)
        half = s.shape[1] // 2
        s = s[:, :half] + s[:, half:]
    eps32 = torch.tensor(eps, dtype=torch.float32)
    return (1.0 / torch.sqrt(s / float(hidden) + eps32)).to(sums.device)


def rms_norm_chunked_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The norm kernel's output bit for bit: HF's rounding with the sum of squares in
    common.cu's chunk order (:func:`rms_norm_ref` differs from it in the last bit at most
    through 1/rms)."""
    inv = norm_inv_ref(norm_chunk_sums_ref(x), x.shape[1], eps)
    normed = (x.float() * inv).half()
    return (normed.float() * weight.float()).half()


def rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [T, heads, D] with per-token angles cos/sin [T, D/2], fp32 math."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).half()


def rope_kv_write_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                      slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
                      num_q_heads: int, num_kv_heads: int) -> torch.Tensor:
    """Reference of ``rope_kv_write``: returns rotated q [T, Hq, D], writes k/v into the caches."""
    tokens = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_q_heads + 2 * num_kv_heads)
    q, k, v = qkv.view(tokens, -1, head_dim).split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
    pos, slot = positions.long(), slots.long()
    in_table = (pos >= 0) & (pos < cos.shape[0])
    angles = pos.clamp(0, cos.shape[0] - 1)
    c, s = cos[angles, : head_dim // 2], sin[angles, : head_dim // 2]  # [T, D/2]
    q_rot = rotate_ref(q, c, s)
    q_rot[~in_table] = 0  # the kernel leaves those rows unwritten; zero them here
    in_cache = (pos >= 0) & (pos < k_cache.shape[2]) & (slot >= 0) & (slot < k_cache.shape[0])
    keep_k = in_cache & in_table
    k_rot = rotate_ref(k, c, s)
    k_cache[slot[keep_k], :, pos[keep_k]] = k_rot[keep_k]  # [n, Hkv, D]
    v_cache[slot[in_cache], :, pos[in_cache]] = v[in_cache]
    return q_rot


def decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                         slots: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """softmax(q K^T * scale) V over positions 0..len-1 of each sequence's slot, fp32 math.

    q [B, Hq, D]; caches [S, Hkv, L, D]. Returns [B, Hq, D] in q's dtype (zeros for len 0).
    """
    batch, hq, head_dim = q.shape
    num_slots, hkv, max_len, _ = k_cache.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros_like(q)
    for b in range(batch):
        slot, n = int(slots[b]), min(int(seq_lens[b]), max_len)
        if n <= 0 or not 0 <= slot < num_slots:
            continue
        keys = k_cache[slot, :, :n].float()  # [Hkv, n, D]
        values = v_cache[slot, :, :n].float()
        qg = q[b].float().view(hkv, hq // hkv, head_dim)  # [Hkv, G, D]: heads of a kv group together
        probs = torch.softmax(qg @ keys.transpose(1, 2) * scale, dim=-1)  # [Hkv, G, n]
        out[b] = (probs @ values).reshape(hq, head_dim).to(q.dtype)
    return out


def temperature_draw_ref(logits: torch.Tensor, vocab: int, params: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """temperature_draw.cu: for each row of ``logits`` [B, ld] whose ``params`` [4, >= B]
    (temperature, top_p, top_k, u) have a temperature and neither top-k nor top-p, the first
    index of the row's first ``vocab`` logits whose cumulative softmax(l / T) exceeds u x total
    (app.engine.sampling.draw); other rows keep ``out`` [B] (the argmax). NaN counts as -inf."""
    for i in range(logits.shape[0]):
        temperature, top_p, top_k, u = (float(v) for v in params[:, i])
        if not (temperature > 0 and top_p >= 1 and top_k <= 0):
            continue
        scaled = logits[i, :vocab].float() / temperature
        scaled = scaled.nan_to_num(nan=float("-inf"), posinf=3.0e38, neginf=float("-inf"))
        if bool(torch.all(scaled == float("-inf"))):
            continue  # nothing drawable: the argmax stays
        cdf = torch.softmax(scaled, -1).cumsum(-1)  # as app.engine.sampling.draw, operation for operation
        point = torch.tensor([u], dtype=cdf.dtype, device=cdf.device) * cdf[-1:]
        out[i] = torch.searchsorted(cdf, point, right=True).clamp_(max=vocab - 1)[0]
    return out
