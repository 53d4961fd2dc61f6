"""The operations one decode step is made of, on the GPU kernels or on their references.

:class:`KernelOps` launches app.kernels (W4/W3 GEMV with fused epilogues, RMSNorm, RoPE +
KV write, flash-decoding attention, or the last two in one: ``rope_attention``).
:class:`ReferenceOps` computes the same thing with ``app.kernels.reference`` on any device,
with the kernels' preconditions (fp16, contiguous, int32 indices) checked, so the whole runner
runs on the CPU in the test suite and a wrong buffer layout fails there, not on the GPU.

Dense linears (an fp16 model, or a weight whose K is not a multiple of 128) go through
PyTorch (cuBLAS on the GPU) in both. Every op writes into a caller-owned ``out`` buffer:
the decode graphs capture static buffers, nothing is allocated per step.

A quantized linear can fuse the RMSNorm before it (``norm=FusedNorm``: x is the residual row,
batch 1; :meth:`fuses_norm` says where) with the chunk sums the residual linear before it left
(``sums_out``). ReferenceOps normalizes with the reference norm instead (it needs no sums), so
the CPU runner checks the same wiring.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from app import kernels
from app.engine.cuda.weights import LinearWeight
from app.engine.runner import RunnerOptions
from app.engine.sampling import sample_rows
from app.kernels import gemv
from app.kernels import reference as ref
from app.kernels.attention import HEAD_DIMS, ROPE_MAX_ROWS
from app.kernels.gemv import FusedNorm, fuses_norm


def dense_linear(x: torch.Tensor, w: LinearWeight, residual: torch.Tensor | None, out: torch.Tensor) -> torch.Tensor:
    """out = fp16(x W^T + b) (+ residual, rounded again: the unfused PyTorch rounding)."""
    if residual is None:
        if w.bias is None:
            return torch.mm(x, w.dense.t(), out=out)
        return torch.addmm(w.bias, x, w.dense.t(), out=out)
    return torch.add(residual, F.linear(x, w.dense, w.bias), out=out)  # out may be residual


def dense_gate_up(x: torch.Tensor, w: LinearWeight, out: torch.Tensor) -> torch.Tensor:
    gate_up = F.linear(x, w.dense, w.bias)  # [M, 2I]
    half = w.out_features // 2
    return torch.mul(F.silu(gate_up[:, :half]), gate_up[:, half:], out=out)


class KernelOps:
    """app.kernels on the GPU (needs ``app.kernels.available()``), launched as ``options`` say."""

    name = "kernels"

    def __init__(self, options: RunnerOptions = RunnerOptions()):
        self.k = kernels
        self.options = options

    def fuses_norm(self, m: int, w: LinearWeight, gated: bool) -> bool:
        """Whether to fuse the norm before ``w`` at batch m (the kernels can, and it pays)."""
        n_out = w.out_features // 2 if gated else w.out_features
        limit = self.options.norm_prologue_bytes
        return fuses_norm(m, w.in_features) and gemv.norm_prologue_bytes(n_out, w.in_features, gated,
                                                                          w.scales.device) <= limit

    def linear(self, x, w: LinearWeight, *, out, residual=None, norm: FusedNorm | None = None, sums_out=None):
        if not w.quantized:
            _no_fusion(w, norm, sums_out)
            return dense_linear(x, w, residual, out)
        kernel = self.k.gemv_w4 if w.bits == 4 else self.k.gemv_w3
        return kernel(x, *_tiles(w), w.scales, bias=w.bias, residual=residual, out=out, norm=norm, sums_out=sums_out,
                      options=self.options.gemv)

    def gate_up(self, x, w: LinearWeight, *, out, norm: FusedNorm | None = None):
        if not w.quantized or w.bias is not None:  # the fused kernel has no bias epilogue
            return _unfused_gate_up(self, x, w, out, norm)
        kernel = self.k.gate_up_silu_w4 if w.bits == 4 else self.k.gate_up_silu_w3
        return kernel(x, *_tiles(w), w.scales, out=out, norm=norm, options=self.options.gemv)

    def argmax(self, logits, *, out, workspace):
        """out[i] = torch.argmax(logits[i]) (argmax.cu: two programmatic launches)."""
        return self.k.argmax_rows(logits, workspace=workspace, out=out)

    def temperature_draw(self, logits, vocab, params, *, workspace, out):
        """out[i] = the token drawn at row i's temperature where it has neither top-k nor top-p
        (temperature_draw.cu: two programmatic launches, no sort); other rows keep out[i]."""
        return self.k.temperature_draw(logits, vocab, params, workspace=workspace, out=out)

    def filtered_draw(self, logits, vocab, params, *, workspace, out):
        """Likewise for the rows with top-k and / or top-p (ten launches, no sort)."""
        return self.k.filtered_draw(logits, vocab, params, workspace=workspace, out=out)

    def rms_norm(self, x, weight, eps, *, out, residual=None):
        if residual is None:
            return self.k.rms_norm(x, weight, eps, out=out)
        return self.k.rms_norm(x, weight, eps, residual=residual, out=out, residual_out=residual)

    def rope_kv_write(self, qkv, cos, sin, positions, slots, k_cache, v_cache, *, num_q_heads, num_kv_heads, q_out):
        return self.k.rope_kv_write(qkv, cos, sin, positions, slots, k_cache, v_cache, num_q_heads=num_q_heads,
                                    num_kv_heads=num_kv_heads, q_out=q_out)

    def attention(self, q, k_cache, v_cache, seq_lens, slots, *, workspace, out):
        return self.k.decode_attention(q, k_cache, v_cache, seq_lens, slots, workspace=workspace, out=out)

    def rope_attention(self, qkv, cos, sin, positions, seq_lens, slots, k_cache, v_cache, *, num_q_heads,
                       workspace, out):
        """rope_kv_write + attention in the attention's launches (bit-equal, one launch fewer)."""
        return self.k.rope_decode_attention(qkv, cos, sin, positions, seq_lens, slots, k_cache, v_cache,
                                            num_q_heads=num_q_heads, workspace=workspace, out=out)


def _tiles(w: LinearWeight) -> tuple[torch.Tensor, ...]:
    """The GEMVs read the tile layout; the runner converts (layout.to_kernel_layout)."""
    if w.layout != "tiles":
        raise ValueError(f"{w.name}: packed weights must be in the tile layout for the GEMV kernels")
    return (w.qa,) if w.bits == 4 else (w.qa, w.qb)


def _unfused_gate_up(ops, x, w: LinearWeight, out, norm):
    """A dense gate/up (cuBLAS) or one with an MLP bias: neither takes a fused norm."""
    _no_fusion(w, norm, None)
    return dense_gate_up(x, w, out) if not w.quantized else _biased_gate_up(ops, x, w, out)


def _biased_gate_up(ops, x, w: LinearWeight, out):
    """Gate/up with an MLP bias (no Qwen/Llama config has one): two GEMVs, then SiLU * up."""
    half = w.out_features // 2
    gate_up = torch.empty((x.shape[0], w.out_features), dtype=torch.float16, device=x.device)
    ops.linear(x, w, out=gate_up)
    return torch.mul(F.silu(gate_up[:, :half]), gate_up[:, half:], out=out)


class ReferenceOps:
    """The kernels' PyTorch references (app.kernels.reference), with the kernels' checks."""

    name = "reference"

    @staticmethod
    def fuses_norm(m: int, w: LinearWeight, gated: bool) -> bool:
        return fuses_norm(m, w.in_features)  # wherever the kernels can: the CPU checks the wiring

    def linear(self, x, w: LinearWeight, *, out, residual=None, norm: FusedNorm | None = None, sums_out=None):
        _check_fp16(x=x, out=out)
        if not w.quantized:
            _no_fusion(w, norm, sums_out)
            return dense_linear(x, w, residual, out)
        x = _normalized(x, norm)
        if w.bits == 4:
            y = ref.gemv_w4_ref(x, *w.checkpoint_words(), w.scales, w.bias, residual)
        else:
            y = ref.gemv_w3_ref(x, *w.checkpoint_words(), w.scales, w.bias, residual)
        out.copy_(y)
        if sums_out is not None:
            sums_out.copy_(ref.norm_chunk_sums_ref(out))
        return out

    def gate_up(self, x, w: LinearWeight, *, out, norm: FusedNorm | None = None):
        _check_fp16(x=x, out=out)
        if not w.quantized or w.bias is not None:
            return _unfused_gate_up(self, x, w, out, norm)
        x = _normalized(x, norm)
        if w.bits == 4:
            return out.copy_(ref.gate_up_silu_w4_ref(x, *w.checkpoint_words(), w.scales))
        return out.copy_(ref.gate_up_silu_w3_ref(x, *w.checkpoint_words(), w.scales))

    def argmax(self, logits, *, out, workspace):
        _check_fp16(logits=logits)
        return torch.argmax(logits, dim=-1, out=out)

    def temperature_draw(self, logits, vocab, params, *, workspace, out):
        _check_fp16(logits=logits)
        if params.dtype != torch.float32 or params.shape[0] != 4 or params.shape[1] < logits.shape[0]:
            raise TypeError(f"draw parameters: fp32 [4, >= {logits.shape[0]}] expected, got {params.dtype} "
                            f"{tuple(params.shape)}")
        return ref.temperature_draw_ref(logits, vocab, params, out)

    def filtered_draw(self, logits, vocab, params, *, workspace, out):
        """The host sampler's arithmetic (app.engine.sampling.sample_rows), row by row."""
        _check_fp16(logits=logits)
        temperature, top_p, top_k, u = params
        for i in range(logits.shape[0]):
            if temperature[i] > 0 and (top_p[i] < 1 or top_k[i] > 0):
                at = slice(i, i + 1)
                sample_rows(logits[at, :vocab], temperature[at], top_p[at], top_k[at].long(), u[at], out[at],
                            filtered=True)
        return out

    def rms_norm(self, x, weight, eps, *, out, residual=None):
        _check_fp16(x=x, weight=weight, out=out)
        if residual is None:
            return out.copy_(ref.rms_norm_ref(x, weight, eps))
        y, h = ref.rms_norm_ref(x, weight, eps, residual)
        residual.copy_(h)
        return out.copy_(y), residual

    def rope_kv_write(self, qkv, cos, sin, positions, slots, k_cache, v_cache, *, num_q_heads, num_kv_heads, q_out):
        _check_fp16(qkv=qkv, k_cache=k_cache, v_cache=v_cache, q_out=q_out)
        _check_index(positions=positions, slots=slots)
        if cos.dtype != torch.float32 or sin.dtype != torch.float32:
            raise TypeError("rope tables must be fp32 (the kernel reads fp32)")
        q = ref.rope_kv_write_ref(qkv, cos, sin, positions, slots, k_cache, v_cache,
                                  num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)
        return q_out.copy_(q)

    def attention(self, q, k_cache, v_cache, seq_lens, slots, *, workspace, out):
        _check_fp16(q=q, k_cache=k_cache, v_cache=v_cache, out=out)
        _check_index(seq_lens=seq_lens, slots=slots)
        return out.copy_(ref.decode_attention_ref(q, k_cache, v_cache, seq_lens, slots))

    def rope_attention(self, qkv, cos, sin, positions, seq_lens, slots, k_cache, v_cache, *, num_q_heads,
                       workspace, out):
        if qkv.shape[0] > ROPE_MAX_ROWS:
            raise ValueError(f"a fused RoPE attention takes at most {ROPE_MAX_ROWS} rows, got {qkv.shape[0]}")
        q = torch.empty_like(out)
        self.rope_kv_write(qkv, cos, sin, positions, slots, k_cache, v_cache, num_q_heads=num_q_heads,
                           num_kv_heads=k_cache.shape[1], q_out=q)
        return self.attention(q, k_cache, v_cache, seq_lens, slots, workspace=workspace, out=out)


def unsupported_shape(spec) -> str | None:
    """Why the CUDA kernels cannot run a model of this shape (the engine then runs the PyTorch
    reference path on the GPU), or None."""
    if spec.head_dim not in HEAD_DIMS:
        return f"head_dim {spec.head_dim} has no decode-attention kernel (only {' and '.join(map(str, HEAD_DIMS))})"
    return None


def _no_fusion(w: LinearWeight, norm, sums_out) -> None:
    if norm is not None or sums_out is not None:
        raise ValueError(f"{w.name}: a fused norm needs a quantized linear without an MLP bias")


def _normalized(x: torch.Tensor, norm: FusedNorm | None) -> torch.Tensor:
    """The reference side of a fused norm: x (the residual row) through the reference RMSNorm."""
    if norm is None:
        return x
    if not fuses_norm(x.shape[0], x.shape[1]) or norm.sums.shape[-1] != x.shape[1] // 16:
        raise ValueError(f"fused norm: batch {x.shape[0]} with hidden size {x.shape[1]} is not fusable")
    return ref.rms_norm_ref(x, norm.weight, norm.eps)


def _check_fp16(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.float16 or not t.is_contiguous():
            raise TypeError(f"{name}: the kernels need a contiguous fp16 tensor, got {t.dtype} "
                            f"contiguous={t.is_contiguous()}")


def _check_index(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous():
            raise TypeError(f"{name}: the kernels need a contiguous int32 vector, got {t.dtype} {tuple(t.shape)}")


def default_ops(device: torch.device, options: RunnerOptions = RunnerOptions()):
    """The kernels on a GPU, launched as ``options`` say; their references elsewhere (the
    references compute the same bits whatever the launch options)."""
    return KernelOps(options) if device.type == "cuda" else ReferenceOps()
