"""The first prefill chunk of a prompt from CUDA graphs, one per token bucket (16 .. the chunk).

Why: the eager GEMM prefill launches ~35-40 ops per layer from Python (tiles, cuBLAS,
attention, norms, RoPE), so a short prompt is launch-bound (the host's launches take several
times the GPU's work; docs/KERNELS.md § Prefill), and in the server each new request's prefill
stalls the other streams' decode for that long. Replaying a graph costs one launch.

How: the prompt is padded to its bucket. The graph reads static device inputs that the host
rewrites before each replay (one pinned buffer, one asynchronous copy): token ids, positions
0..B-1, per-token cache slots, the cache rows attention gathers, and the index of the last
real token. Pad tokens come after the real ones with id 0 and slot -1, so the RoPE + KV
kernel writes nothing for them and causal attention keeps the real rows exact; their
outputs are never read. Attention gathers its keys and values by row index from the cache
(``gathered_attention``): real position j reads row (slot, j), a pad reads row (slot, 0),
which real token 0 has just written, so no row of an earlier prompt (stale, possibly never
finite) is ever read, even by the pads. Logits: the last real row (index_select by the
device index), the final norm, the lm_head GEMV into a static buffer.

Only chunks that start at position 0 come here (their keys are their own); chunks after the
first run eagerly (app.engine.cuda.prefill). Without graphs (the CPU, ``use_graphs=False``)
:meth:`PrefillGraphs.run` runs the same padded path eagerly.

When: the load captures only the largest bucket, which sizes the memory pool that every bucket's
graph shares (capturing the six buckets took ~40 % of a cached 3B load). Each smaller bucket is
captured at its first prompt: that prompt runs eagerly on the capture stream (its answer, and
the warm-up), then the graph is recorded into the shared pool for the next one.
"""

from __future__ import annotations

import torch

from app.engine.cuda.graphs import capture_stream
from app.engine.cuda.prefill import GemmPrefill, gathered_attention

PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512)


def prefill_buckets(chunk: int, max_context: int) -> list[int]:
    """Token buckets that get a graph: powers of two up to the chunk, never past the context
    (the pads' positions must stay inside the cache and the RoPE tables)."""
    limit = min(chunk, max_context)
    return sorted({b for b in PREFILL_BUCKETS if b < limit} | {limit})


class PrefillInputs:
    """Static int32 device inputs of the bucketed prefill and their pinned host twin.

    One buffer, views in this order: ids [C], positions [C], slots [C], rows [Hkv*C], last [1];
    bucket B reads the first B entries of each (the first Hkv*B of ``rows``).
    """

    def __init__(self, capacity: int, kv_heads: int, cache_len: int, device: torch.device):
        self.capacity, self.kv_heads, self.cache_len = capacity, kv_heads, cache_len
        sizes = {"ids": capacity, "positions": capacity, "slots": capacity, "rows": kv_heads * capacity, "last": 1}
        total = sum(sizes.values())
        self.host = torch.zeros(total, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.device = torch.zeros(total, dtype=torch.int32, device=device)
        self.h, self.d, offset = {}, {}, 0
        for name, n in sizes.items():
            self.h[name], self.d[name] = self.host[offset:offset + n], self.device[offset:offset + n]
            offset += n
        self.arange = torch.arange(capacity, dtype=torch.int32)
        self.h["positions"].copy_(self.arange)  # start == 0: row j is position j, pads included
        self.h["slots"].fill_(-1)  # until written: pads everywhere (the warm-up writes no cache row)
        self.d["positions"].copy_(self.h["positions"])
        self.d["slots"].fill_(-1)
        # Marks when the GPU has read the pinned buffer (the copy is asynchronous).
        self.uploaded = torch.cuda.Event() if device.type == "cuda" else None

    def view(self, name: str, bucket: int) -> torch.Tensor:
        return self.d[name][: bucket * (self.kv_heads if name == "rows" else 1)]

    def write(self, slot: int, ids: list[int], bucket: int) -> None:
        """Upload ``ids`` (positions 0..T-1 of ``slot``) padded to ``bucket`` tokens."""
        t, h = len(ids), self.h
        if self.uploaded is not None:
            self.uploaded.synchronize()  # the previous upload has left the pinned buffer
        h["ids"][:t] = torch.tensor(ids, dtype=torch.int32)
        h["ids"][t:bucket] = 0
        h["slots"][:t] = slot
        h["slots"][t:bucket] = -1
        # rows of the cache seen as [S*Hkv*L, D]: (slot, head, position); the pads read position 0
        base = (slot * self.kv_heads + self.arange[: self.kv_heads, None]) * self.cache_len  # [Hkv, 1]
        rows = h["rows"][: self.kv_heads * bucket].view(self.kv_heads, bucket)  # [Hkv, B], head-major
        rows[:, :t] = base + self.arange[None, :t]
        rows[:, t:] = base
        h["last"][0] = t - 1
        self.device.copy_(self.host, non_blocking=True)
        if self.uploaded is not None:
            self.uploaded.record()


class PrefillGraphs:
    """Runs the padded first-chunk prefill for a bucket: a replayed CUDA graph, or eagerly."""

    def __init__(self, prefill: GemmPrefill, buckets: list[int], use_graphs: bool):
        self.prefill = prefill
        self.buckets = sorted(buckets)
        spec, dev = prefill.spec, prefill.w.device
        self.inputs = PrefillInputs(self.buckets[-1], spec.num_kv_heads, prefill.cache.max_context, dev)
        self.logits = torch.empty((1, spec.vocab_size), dtype=torch.float16, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.reserved_bytes = 0  # what capturing the largest (the shared pool) added to reserved memory
        self.capturing = use_graphs
        self._pool = None  # the graphs' shared memory pool, made by the largest bucket's graph
        if use_graphs:
            self._capture_largest()

    @property
    def largest(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} tokens are more than the largest prefill bucket ({self.largest})")

    def run(self, slot: int, ids: list[int]) -> torch.Tensor:
        """Prefill ``ids`` (1..largest tokens) at positions 0.. of ``slot``; fp16 logits [V] of the
        last token (a view of a static buffer: valid until the next run)."""
        bucket = self.bucket_for(len(ids))
        self.inputs.write(slot, ids, bucket)
        graph = self.graphs.get(bucket)
        if graph is not None:
            graph.replay()
        elif self.capturing:
            self._first_prompt_of(bucket)
        else:
            self._forward(bucket)
        return self.logits[0]

    def _forward(self, bucket: int) -> None:
        inputs, cache = self.inputs, self.prefill.cache
        rows = inputs.view("rows", bucket)
        pending, h = self.prefill.layers(
            inputs.view("ids", bucket), inputs.view("positions", bucket), inputs.view("slots", bucket),
            lambda i, q: gathered_attention(q, cache.k[i], cache.v[i], rows))
        last = inputs.d["last"]
        self.prefill.logits(pending.index_select(0, last), h.index_select(0, last), out=self.logits)

    @torch.inference_mode()
    def _first_prompt_of(self, bucket: int) -> None:
        """Run ``bucket``'s first prompt eagerly, then record its graph into the shared pool.

        Both on the capture stream, as the load's warm-up and capture of the largest bucket are,
        and the eager activations are handed back after (empty_cache). PyTorch keeps a cuBLAS
        workspace per thread's handle and stream: this runs on the engine's thread, not the
        loader's, so it makes one more, which the VRAM plan counts (memory.prefill_graph_bytes)."""
        dev = self.logits.device
        side = capture_stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self._forward(bucket)  # the prompt's answer (KV rows and logits)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=side):
            self._forward(bucket)
        self.graphs[bucket] = graph
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.empty_cache()

    @torch.inference_mode()
    def _capture_largest(self) -> None:
        dev = self.logits.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # so that the reserved-memory delta below is what capturing adds
        before = torch.cuda.memory_reserved(dev)
        # Warm up on the stream that then captures (one cuBLAS workspace, not two): kernels
        # compile, cuBLAS and SDPA pick their kernels. The inputs hold pads (slot -1): no cache
        # row is written. The warm-up's activations are then handed back (empty_cache): they
        # would otherwise stay reserved for the side stream next to the graphs' pool.
        side = capture_stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            self._forward(self.largest)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()  # largest first: the others reuse its memory pool
        with torch.cuda.graph(graph, stream=side):
            self._forward(self.largest)
        self._pool = graph.pool()
        self.graphs[self.largest] = graph
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        self.reserved_bytes = torch.cuda.memory_reserved(dev) - before

    def close(self) -> None:
        self.graphs.clear()
