"""Prefill of a prompt chunk on the GPU: dequantize weight tiles + cuBLAS GEMM, SDPA attention.

Decode reads each weight once per token, so it uses the GEMV kernels; a prompt of T tokens
reuses each weight T times, so here each quantized weight is dequantized tile by tile into
one reused fp16 buffer (``tile_elements`` values; the CUDA kernel of app.kernels.dequant
when it compiles, else PyTorch) and multiplied by all T tokens with cuBLAS. Attention is
PyTorch's scaled_dot_product_attention over the slot's cached keys: one call with
``enable_gqa`` (torch >= 2.5) when the chunk starts at position 0, or later where flash
attention takes it (causal from the bottom-right corner: the chunk sees every earlier key),
else one call per query group with a mask (no K/V repeat for GQA). Only the last token goes
through the final norm and lm_head.

The KV cache is written by the same RoPE + KV kernel as decode, and every rounding point
is the reference model's, so prefill and decode agree to fp16 summation order.

:class:`GemmPrefill` runs eagerly; app.engine.cuda.prefill_graphs replays the first chunk of
a prompt from CUDA graphs (padded to a token bucket) through the same :meth:`GemmPrefill.layers`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from app.engine.cuda.weights import DequantTables, LinearWeight, ModelWeights, dequantize_rows, lookup_rows
from app.engine.kv_cache import StaticKVCache

TILE_ROW_MULTIPLE = 16


def torch_at_least(major: int, minor: int) -> bool:
    version = torch.__version__.split("+")[0].split(".")
    return (int(version[0]), int(version[1])) >= (major, minor)


# One SDPA call for all query groups: flash attention takes Hq != Hkv itself. Only without a
# mask: the masked backends may not support GQA, and the math fallback would materialize
# [Hq, T, S] scores (the planner's workspace has no room for them). torch 2.4: per-group loop.
SDPA_GQA = torch_at_least(2, 5)

Attend = Callable[[int, torch.Tensor], torch.Tensor]  # (layer, rotated q [T, Hq, D]) -> [T, Hq*D]


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D] over keys, values [1, Hkv, S, D] -> [T, Hq*D]; head h reads kv head h // G.

    mask None: causal from the top-left corner (query i sees keys 0..i; T == S here).
    """
    t, hq, d = q.shape
    hkv = keys.shape[1]
    if SDPA_GQA and mask is None:
        heads = q.transpose(0, 1)[None]  # [1, Hq, T, D] (a view: the last dim stays contiguous)
        out = F.scaled_dot_product_attention(heads, keys, values, is_causal=True, enable_gqa=True)
        return out[0].transpose(0, 1).reshape(t, hq * d)  # [Hq, T, D] -> [T, Hq*D]
    group = hq // hkv
    grouped = q.view(t, hkv, group, d).permute(2, 1, 0, 3).contiguous()  # [G, Hkv, T, D]
    out = torch.empty_like(grouped)
    for g in range(group):
        out[g] = F.scaled_dot_product_attention(grouped[g][None], keys, values, attn_mask=mask,
                                                is_causal=mask is None)[0]
    return out.permute(2, 1, 0, 3).reshape(t, hq * d)  # back to head h = kv * G + g


def causal_attention(q: torch.Tensor, k_slot: torch.Tensor, v_slot: torch.Tensor, start: int) -> torch.Tensor:
    """q [T, Hq, D] at positions start..start+T-1 over keys 0..start+T-1 of one slot -> [T, Hq*D].

    k_slot, v_slot: [Hkv, L, D] (the slot's cache, already holding this chunk's keys).
    """
    t, hq, d = q.shape
    end = start + t
    keys, values = k_slot[None, :, :end], v_slot[None, :, :end]  # [1, Hkv, S, D]
    if not start:
        return grouped_attention(q, keys, values)
    heads = q.transpose(0, 1)[None]  # [1, Hq, T, D]
    if flash_takes_gqa(heads, keys, values):  # query i sees keys 0..start+i: causal from the bottom right
        out = bottom_right_causal(heads, keys, values)
        return out[0].transpose(0, 1).reshape(t, hq * d)  # [Hq, T, D] -> [T, Hq*D]
    mask = torch.arange(end, device=q.device)[None, :] <= torch.arange(start, end, device=q.device)[:, None]
    return grouped_attention(q, keys, values, mask)


def bottom_right_causal(heads: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """[1, Hq, T, D] queries at the last T of S positions over [1, Hkv, S, D] -> [1, Hq, T, D].

    On the GPU: flash attention's own causal mode, which aligns the mask to the bottom right
    when T < S (what torch.nn.attention.bias.causal_lower_right dispatches to; that module is not
    imported: it imports torch._dynamo, seconds of start-up). Elsewhere the mask materialized."""
    t, s = heads.shape[-2], keys.shape[-2]
    if heads.device.type == "cuda":
        return torch.ops.aten._scaled_dot_product_flash_attention(heads, keys, values, 0.0, is_causal=True)[0]
    mask = torch.arange(s, device=heads.device)[None, :] <= torch.arange(s - t, s, device=heads.device)[:, None]
    return F.scaled_dot_product_attention(heads, keys, values, attn_mask=mask, enable_gqa=True)


def flash_takes_gqa(heads: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether flash attention runs these [1, H, T|S, D] inputs with Hq != Hkv as they are. Only
    then is one call over all groups safe: the other backends would repeat K/V or materialize
    [Hq, T, S] scores, which the prefill's planned workspace has no room for."""
    if not SDPA_GQA or heads.device.type != "cuda":
        return False
    try:
        params = torch.backends.cuda.SDPAParams(heads, keys, values, None, 0.0, False, True)  # (.., enable_gqa)
    except TypeError:  # SDPAParams without enable_gqa (private API): keep the group loop
        return False
    # bottom_right_causal calls flash itself, which takes head sizes of whole 8s unpadded
    return heads.shape[-1] % 8 == 0 and torch.backends.cuda.can_use_flash_attention(params)


def gathered_attention(q: torch.Tensor, k_layer: torch.Tensor, v_layer: torch.Tensor,
                       rows: torch.Tensor) -> torch.Tensor:
    """Causal attention of a chunk at positions 0..T-1 whose keys are rows ``rows`` [Hkv*T] of one
    layer's cache seen as [S*Hkv*L, D]: the slot is device data, not a Python int, so a CUDA
    graph replays this for any slot. q [T, Hq, D] -> [T, Hq*D]."""
    t, _, d = q.shape
    keys = k_layer.view(-1, d).index_select(0, rows).view(1, -1, t, d)  # [S*Hkv*L, D] -> [1, Hkv, T, D]
    values = v_layer.view(-1, d).index_select(0, rows).view(1, -1, t, d)
    return grouped_attention(q, keys, values)


class GemmPrefill:
    def __init__(self, weights: ModelWeights, ops, cache: StaticKVCache, rope: tuple[torch.Tensor, torch.Tensor],
                 tables: DequantTables, *, chunk: int, tile_elements: int, dequant_kernel=None):
        self.w, self.ops, self.cache, self.tables = weights, ops, cache, tables
        self.cos, self.sin = rope
        self.spec = weights.spec
        self.chunk = chunk
        self.dequant_kernel = dequant_kernel  # app.kernels.dequant.DequantKernel or None
        widest = max(self.spec.hidden_size, self.spec.intermediate_size)
        # at least one 16-row tile of the widest weight, whatever the plan says
        self.tile = torch.empty(max(tile_elements, TILE_ROW_MULTIPLE * widest), dtype=torch.float16,
                                device=weights.device)

    @property
    def nbytes(self) -> int:
        return self.tile.numel() * 2

    def run(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Prefill ``ids`` at positions start.. of ``slot``; fp16 logits [V] of the last token."""
        last = None
        for offset in range(0, len(ids), self.chunk):
            last = self._chunk(slot, ids[offset:offset + self.chunk], start + offset)
        pending, h = last
        return self.logits(pending[-1:], h[-1:])[0]

    def _chunk(self, slot: int, ids: list[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        dev, t = self.w.device, len(ids)
        ids_t = torch.tensor(ids, dtype=torch.int32).to(dev)
        positions = torch.arange(start, start + t, dtype=torch.int32, device=dev)
        slots = torch.full((t,), slot, dtype=torch.int32, device=dev)
        cache = self.cache
        return self.layers(ids_t, positions, slots,
                           lambda i, q: causal_attention(q, cache.k[i][slot], cache.v[i][slot], start))

    def layers(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               attend: Attend) -> tuple[torch.Tensor, torch.Tensor]:
        """Embedding and every layer over T tokens (int32 [T] ids, positions, cache slots).

        Returns (the last sublayer's output, the residual stream), fp16 [T, H] each: the final
        norm adds them (fused), as every norm does for the sublayer before it.
        """
        s, w, ops, dev = self.spec, self.w, self.ops, self.w.device
        t = ids.shape[0]
        h = lookup_rows(w.embed, ids, self.tables, torch.empty((t, s.hidden_size), dtype=torch.float16, device=dev),
                        self.dequant_kernel)
        y = torch.empty_like(h)
        pending = None  # the last sublayer's output, added to h by the next norm (fused)
        for i, layer in enumerate(w.layers):
            self._norm(pending, h, layer.input_norm, y)
            qkv = self.linear(y, layer.qkv)  # [T, (Hq + 2 Hkv) D]
            q = torch.empty((t, s.num_heads, s.head_dim), dtype=torch.float16, device=dev)
            ops.rope_kv_write(qkv, self.cos, self.sin, positions, slots, self.cache.k[i], self.cache.v[i],
                              num_q_heads=s.num_heads, num_kv_heads=s.num_kv_heads, q_out=q)
            self._norm(self.linear(attend(i, q), layer.o), h, layer.post_norm, y)
            pending = self.linear(self.gate_up(y, layer.gate_up), layer.down)
        return pending, h

    def _norm(self, pending: torch.Tensor | None, h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor) -> None:
        eps = self.spec.rms_norm_eps
        if pending is None:
            self.ops.rms_norm(h, weight, eps, out=y)
        else:
            self.ops.rms_norm(pending, weight, eps, out=y, residual=h)  # h = h + pending; y = norm(h)

    def logits(self, pending: torch.Tensor, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """fp16 logits [1, V] of one token from its (pending, residual) rows [1, H]; ``h`` is updated."""
        y = torch.empty_like(h)
        self._norm(pending, h, self.w.final_norm, y)
        if out is None:
            out = torch.empty((1, self.spec.vocab_size), dtype=torch.float16, device=h.device)
        return self.ops.linear(y, self.w.lm_head, out=out)  # GEMV for one token

    # -- linears over T tokens ------------------------------------------------------------
    def _tile_rows(self, k: int) -> int:
        return max(TILE_ROW_MULTIPLE, self.tile.numel() // k // TILE_ROW_MULTIPLE * TILE_ROW_MULTIPLE)

    def _dequant(self, w: LinearWeight, start: int, stop: int) -> torch.Tensor:
        out = self.tile[: (stop - start) * w.in_features].view(stop - start, w.in_features)
        return dequantize_rows(w, start, stop, self.tables, out=out, kernel=self.dequant_kernel)

    def linear(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        """x [T, K] @ W^T (+ b) -> [T, N] fp16."""
        if not w.quantized:
            return F.linear(x, w.dense, w.bias)
        n = w.out_features
        rows = self._tile_rows(w.in_features)
        if rows >= n:
            return F.linear(x, self._dequant(w, 0, n), w.bias)
        out = torch.empty((x.shape[0], n), dtype=torch.float16, device=x.device)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            bias = None if w.bias is None else w.bias[r0:r1]
            out[:, r0:r1] = F.linear(x, self._dequant(w, r0, r1), bias)
        return out

    def gate_up(self, x: torch.Tensor, w: LinearWeight) -> torch.Tensor:
        """silu(x Wg^T) * (x Wu^T) -> [T, I], gate and up tiles of the same rows together."""
        inter = w.out_features // 2
        if not w.quantized:
            gate_up = F.linear(x, w.dense, w.bias)
            return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        act = torch.empty((x.shape[0], inter), dtype=torch.float16, device=x.device)
        rows = self._tile_rows(w.in_features)
        for r0 in range(0, inter, rows):
            r1 = min(inter, r0 + rows)
            gate = F.linear(x, self._dequant(w, r0, r1), None if w.bias is None else w.bias[r0:r1])
            up = F.linear(x, self._dequant(w, inter + r0, inter + r1),
                          None if w.bias is None else w.bias[inter + r0:inter + r1])
            torch.mul(F.silu(gate), up, out=act[:, r0:r1])
        return act
