"""One decode step over static buffers, and its CUDA graphs (one per batch-size bucket).

The step reads token ids, positions, slots and sequence lengths from one static int32
tensor ``inputs [4, rows]`` and writes logits and greedy tokens into static buffers; every
activation lives in a buffer carved from one allocation (:class:`DecodeBuffers`). So the
whole step (embedding lookup, all layers, final norm, lm_head, argmax) is captured once
per bucket and replayed; the host only uploads 16 bytes per row and reads back the tokens.

A batch is padded to its bucket with rows whose slot is -1 and length 0: RoPE + KV write
skips them (slot out of range) and attention returns zeros, so a pad row touches no cache.
The attention's split kernel does RoPE + KV write itself (``RunnerOptions.fuse_rope``, attention.cu).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from app.engine.cuda.step_norms import StepNorms
from app.engine.cuda.weights import DequantTables, ModelWeights, lookup_rows
from app.engine.kv_cache import StaticKVCache
from app.engine.runner import RunnerOptions
from app.kernels.argmax import ARGMAX_BLOCKS
from app.kernels.attention import ROPE_MAX_ROWS, DecodeAttentionWorkspace

_capture_streams: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per device that every CUDA graph is warmed up and captured on.

    Why one: PyTorch keeps a cuBLAS workspace (32 MiB on Hopper) per stream that used cuBLAS,
    for the life of the process. A new stream per model would leave one behind at every model
    switch; one stream per process keeps one."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _capture_streams.get(index)
    if stream is None:
        stream = _capture_streams[index] = torch.cuda.Stream(index)
    return stream


INPUT_ROWS = ("ids", "positions", "slots", "seq_lens")
PAD_ROW = (0, 0, -1, 0)  # token 0 at position 0 in no slot, attending to nothing
BUCKETS = (1, 2, 4, 8)
ALIGN = 256


@dataclass(eq=False)
class DecodeBuffers:
    inputs: torch.Tensor  # int32 [4, R]: ids, positions, slots, seq_lens
    hidden: torch.Tensor  # fp16 [R, H]: the residual stream
    normed: torch.Tensor  # fp16 [R, H]
    qkv: torch.Tensor  # fp16 [R, (Hq + 2 Hkv) D]
    q: torch.Tensor  # fp16 [R, Hq, D] (rotated; only the unfused RoPE writes it)
    attn: torch.Tensor  # fp16 [R, Hq, D]
    act: torch.Tensor  # fp16 [R, I]: silu(gate) * up
    logits: torch.Tensor  # fp16 [R, V]
    tokens: torch.Tensor  # int64 [R]: argmax of logits
    argmax_v: torch.Tensor  # fp32 [R, ARGMAX_BLOCKS]: the argmax's per-slice maxima
    argmax_i: torch.Tensor  # int32 [R, ARGMAX_BLOCKS]: and their indices
    part_o: torch.Tensor  # fp32 [R, Hq, splits, D]: attention partials
    part_ml: torch.Tensor  # fp32 [R, Hq, splits, 2]
    norm_sums: torch.Tensor  # fp32 [2, R, H/16]: chunk sums of h for the fused norms (after o, after down)
    arena: torch.Tensor | None = None

    @classmethod
    def allocate(cls, spec, rows: int, splits: int, device) -> DecodeBuffers:
        hq, d = spec.num_heads, spec.head_dim
        layout = {
            "inputs": ((len(INPUT_ROWS), rows), torch.int32),
            "hidden": ((rows, spec.hidden_size), torch.float16),
            "normed": ((rows, spec.hidden_size), torch.float16),
            "qkv": ((rows, spec.q_size + 2 * spec.kv_size), torch.float16),
            "q": ((rows, hq, d), torch.float16),
            "attn": ((rows, hq, d), torch.float16),
            "act": ((rows, spec.intermediate_size), torch.float16),
            "logits": ((rows, spec.vocab_size), torch.float16),
            "tokens": ((rows,), torch.int64),
            "argmax_v": ((rows, ARGMAX_BLOCKS), torch.float32),
            "argmax_i": ((rows, ARGMAX_BLOCKS), torch.int32),
            "part_o": ((rows, hq, splits, d), torch.float32),
            "part_ml": ((rows, hq, splits, 2), torch.float32),
            "norm_sums": ((2, rows, -(-spec.hidden_size // 16)), torch.float32),
        }
        arena, views = carve(layout, device)
        buffers = cls(**views, arena=arena)
        buffers.inputs.copy_(pad_inputs(rows))
        return buffers

    @property
    def rows(self) -> int:
        return self.inputs.shape[1]

    @property
    def nbytes(self) -> int:
        return self.arena.numel()

    @property
    def workspace(self) -> DecodeAttentionWorkspace:
        return DecodeAttentionWorkspace(self.part_o, self.part_ml)

    def views(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "arena"}


def carve(layout: dict[str, tuple[tuple[int, ...], torch.dtype]], device) -> tuple[torch.Tensor, dict]:
    """One uint8 allocation cut into 256-byte aligned tensors (no per-tensor allocator rounding)."""
    sizes = {name: _numel(shape) * torch.empty((), dtype=dtype).element_size()
             for name, (shape, dtype) in layout.items()}
    total = sum(-(-n // ALIGN) * ALIGN for n in sizes.values())
    arena = torch.zeros(total, dtype=torch.uint8, device=device)
    views, offset = {}, 0
    for name, (shape, dtype) in layout.items():
        views[name] = arena[offset:offset + sizes[name]].view(dtype).view(shape)
        offset += -(-sizes[name] // ALIGN) * ALIGN
    return arena, views


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def pad_inputs(rows: int) -> torch.Tensor:
    """[4, rows] int32 of pad rows (what the buffers hold between steps and during capture)."""
    return torch.tensor(PAD_ROW, dtype=torch.int32)[:, None].repeat(1, rows)


class DecodeStep:
    """The decode step itself, on the first ``b`` rows of the buffers (eager or captured).
    ``options``: whether norms (where it pays, step_norms.py) and RoPE (at most ROPE_MAX_ROWS
    rows) are fused into the kernels after them; bit-equal either way."""

    def __init__(self, weights: ModelWeights, ops, cache: StaticKVCache, rope: tuple[torch.Tensor, torch.Tensor],
                 buffers: DecodeBuffers, tables: DequantTables, dequant_kernel=None,
                 options: RunnerOptions = RunnerOptions()):
        self.w, self.ops, self.cache, self.buffers, self.tables = weights, ops, cache, buffers, tables
        self.options = options
        self.dequant_kernel = dequant_kernel  # the embedding lookup in one launch (kernels/dequant.py), or None
        self.cos, self.sin = rope
        self.spec = weights.spec
        # A fused norm needs quantized GEMVs on both sides (and the gate/up without an MLP bias).
        linears = [lw for layer in weights.layers for lw in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        self.norms_fusable = (weights.spec.hidden_size % 16 == 0 and weights.lm_head.quantized
                              and all(lw.quantized for lw in linears)
                              and all(layer.gate_up.bias is None for layer in weights.layers))
        self._norm_sites: dict[int, frozenset[str]] = {}  # per batch size: decided once, not per step

    def run(self, b: int) -> None:
        s, w, ops, bf = self.spec, self.w, self.ops, self.buffers
        ids, positions, slots, seq_lens = (bf.inputs[r, :b] for r in range(len(INPUT_ROWS)))
        h, qkv, q, attn, act = bf.hidden[:b], bf.qkv[:b], bf.q[:b], bf.attn[:b], bf.act[:b]
        workspace = bf.workspace
        norm = StepNorms(ops, bf, s.rms_norm_eps, b, self.fused_norm_sites(b))
        fuse_rope = self.options.fuse_rope and b <= ROPE_MAX_ROWS
        lookup_rows(w.embed, ids, self.tables, h, self.dequant_kernel)
        for i, layer in enumerate(w.layers):
            k_cache, v_cache = self.cache.k[i], self.cache.v[i]  # [slots, Hkv, L, D] each
            x, fused = norm.before("input", layer.input_norm, first=i == 0)
            ops.linear(x, layer.qkv, out=qkv, norm=fused)
            if fuse_rope:
                ops.rope_attention(qkv, self.cos, self.sin, positions, seq_lens, slots, k_cache, v_cache,
                                   num_q_heads=s.num_heads, workspace=workspace, out=attn)
            else:
                ops.rope_kv_write(qkv, self.cos, self.sin, positions, slots, k_cache, v_cache,
                                  num_q_heads=s.num_heads, num_kv_heads=s.num_kv_heads, q_out=q)
                ops.attention(q, k_cache, v_cache, seq_lens, slots, workspace=workspace, out=attn)
            # h += o_proj(attn), leaving h's chunk sums for the fused norm of the gate/up
            ops.linear(attn.view(b, s.q_size), layer.o, residual=h, out=h, sums_out=norm.sums_after_o())
            x, fused = norm.before("post", layer.post_norm)
            ops.gate_up(x, layer.gate_up, out=act, norm=fused)
            last = i == len(w.layers) - 1
            ops.linear(act, layer.down, residual=h, out=h, sums_out=norm.sums_after_down(last))  # h += down(act)
        x, fused = norm.before("final", w.final_norm)
        ops.linear(x, w.lm_head, out=bf.logits[:b], norm=fused)
        ops.argmax(bf.logits[:b], out=bf.tokens[:b], workspace=(bf.argmax_v, bf.argmax_i))

    def fused_norm_sites(self, b: int) -> frozenset[str]:
        """The norms fused into their GEMV at batch b (app.engine.cuda.step_norms)."""
        if b not in self._norm_sites:
            self._norm_sites[b] = self._decide_norm_sites(b)
        return self._norm_sites[b]

    def _decide_norm_sites(self, b: int) -> frozenset[str]:
        if not (self.options.fuse_norms and self.norms_fusable):
            return frozenset()
        layer = self.w.layers[0]  # every layer has the same shapes
        consumers = {"input": (layer.qkv, False), "post": (layer.gate_up, True), "final": (self.w.lm_head, False)}
        return frozenset(site for site, (lw, gated) in consumers.items() if self.ops.fuses_norm(b, lw, gated))


def decode_buckets(num_slots: int, rows: int, batch_invariant_linears: bool) -> list[int]:
    """Batch sizes that get a graph. cuBLAS (dense linears) may pick another algorithm for
    another M, so a model with dense linears always runs all ``rows``: greedy output then
    does not depend on what else is in the batch. The GEMV kernels are batch-invariant."""
    if not batch_invariant_linears:
        return [rows]
    return sorted({b for b in BUCKETS if b < rows} | {rows})


class DecodeGraphs:
    """Runs :class:`DecodeStep` for a bucket: a replayed CUDA graph, or eagerly."""

    def __init__(self, step: DecodeStep, buckets: list[int], use_graphs: bool):
        self.step = step
        self.buckets = sorted(buckets)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if use_graphs:
            self._capture()

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} is larger than the largest graph ({self.buckets[-1]})")

    def run(self, b: int) -> None:
        graph = self.graphs.get(b)
        if graph is None:
            self.step.run(b)
        else:
            graph.replay()

    def _capture(self) -> None:
        # Warm up on the stream that then captures first: kernels compile, cuBLAS makes its
        # handles; the buffers hold pad rows, so nothing is written to the KV cache.
        side = capture_stream(torch.device("cuda", torch.cuda.current_device()))
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for b in self.buckets:
                self.step.run(b)
        torch.cuda.current_stream().wait_stream(side)
        pool = None
        for b in reversed(self.buckets):  # largest first: the others reuse its memory pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=side):
                self.step.run(b)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def close(self) -> None:
        self.graphs.clear()
