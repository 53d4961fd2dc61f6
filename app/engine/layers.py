"""Building blocks of a Llama-style decoder in plain PyTorch.

This is the reference path: the CPU backend runs it, and the CUDA kernels are checked
against it. Each layer works on one sequence segment at a time (``x`` is [T, hidden]),
which keeps every sequence's arithmetic independent of what else is in the batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from app.formats.spec import ModelSpec, RopeScaling


class Linear(nn.Module):
    """y = x W^T (+ b). A quantized backend swaps this module for its own (same call)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like HF does, then scale in the model dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, with Llama-3 / linear scaling applied."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        old_ctx = scaling.original_max_position_embeddings
        low_wavelen = old_ctx / scaling.low_freq_factor
        high_wavelen = old_ctx / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        smooth = (old_ctx / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_tables(spec: ModelSpec, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_positions, head_dim] in fp32 (HF's rotate-half layout)."""
    inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # [P, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, D] for the tokens' positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def causal_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Attention of T new queries over all S = start + T cached keys of one sequence.

    q [T, H, D]; k, v [Hkv, S, D]. Query i sits at position start + i and sees keys 0..start+i.
    Returns [T, H*D]. Softmax in fp32.
    """
    t, h, d = q.shape
    hkv, s, _ = k.shape
    group = h // hkv
    qg = q.permute(1, 0, 2).reshape(hkv, group, t, d)  # [Hkv, G, T, D]: heads of a KV group together
    scores = torch.matmul(qg.float(), k.float().transpose(-1, -2)[:, None]) / math.sqrt(d)  # [Hkv, G, T, S]
    if t > 1:
        q_pos = torch.arange(start, start + t, device=q.device)[:, None]
        k_pos = torch.arange(s, device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.float()[:, None])  # [Hkv, G, T, D]
    return out.reshape(h, t, d).permute(1, 0, 2).reshape(t, h * d).to(q.dtype)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, layer_index: int):
        super().__init__()
        self.spec = spec
        self.layer_index = layer_index
        # q, k and v projections fused into one matrix at load time: one GEMV instead of three.
        self.qkv_proj = Linear(spec.hidden_size, spec.q_size + 2 * spec.kv_size, bias=spec.attention_bias)
        self.o_proj = Linear(spec.q_size, spec.hidden_size)

    def forward(self, x: torch.Tensor, start: int, slot: int, cache, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        s = self.spec
        t = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, q + 2 kv]
        q, k, v = qkv.split([s.q_size, s.kv_size, s.kv_size], dim=-1)
        cos, sin = rope
        q = apply_rope(q.view(t, s.num_heads, s.head_dim), cos, sin)  # [T, H, D]
        k = apply_rope(k.view(t, s.num_kv_heads, s.head_dim), cos, sin)  # [T, Hkv, D]
        v = v.view(t, s.num_kv_heads, s.head_dim)
        keys, values = cache.append(self.layer_index, slot, start, k, v)  # [Hkv, start+T, D] each
        return self.o_proj(causal_gqa_attention(q, keys, values, start))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.intermediate = spec.intermediate_size
        # gate and up fused into one matrix at load time.
        self.gate_up_proj = Linear(spec.hidden_size, 2 * spec.intermediate_size, bias=spec.mlp_bias)
        self.down_proj = Linear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, layer_index)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor, start: int, slot: int, cache, rope) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), start, slot, cache, rope)
        return x + self.mlp(self.post_attention_layernorm(x))
