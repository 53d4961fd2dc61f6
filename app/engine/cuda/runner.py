"""CudaRunner: the Runner protocol on the GPU (app.engine.runner) with the project's kernels,
every optional capability granted (tokens taken on the device, steps launched ahead, sampled
tokens drawn there unless ``RunnerOptions.draw_on_device`` is off, guessed tokens checked).

- Weights resident in one allocation, W4/W3 through the GEMV kernels, dense fp16 linears
  through cuBLAS; fp16 activations; the static KV cache and every decode buffer allocated
  once, after the VRAM plan (app.engine.cuda.memory) said they fit.
- Decode: the whole step (embedding -> layers -> norm -> lm_head -> argmax) is one CUDA
  graph per batch bucket (app.engine.cuda.graphs); :meth:`decode_tokens` copies back only
  the token ids (the argmax, or drawn on the device after the replay for the slots
  :meth:`set_sampling` names: app.engine.cuda.draw), :meth:`decode` the logits rows (for
  penalties).
- Prefill: "gemm" = dequantized weight tiles + cuBLAS + SDPA (app.engine.cuda.prefill), the
  first chunk of a prompt (start 0) replayed from a CUDA graph per token bucket, padded
  (app.engine.cuda.prefill_graphs), later chunks eagerly; "graph" = the decode graph with
  up to 8 (16 when the budget has room) consecutive tokens of one sequence as its rows (row
  j attends to positions 0..start+j), for budgets with no room for a GEMM workspace.

With ``ReferenceOps`` and no graphs the same runner runs on the CPU (the test suite).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from app.engine.cuda.draw import DeviceDraw
from app.engine.cuda.graphs import INPUT_ROWS, PAD_ROW, DecodeBuffers, DecodeGraphs, DecodeStep, decode_buckets
from app.engine.cuda.in_flight import TokensInFlight
from app.engine.cuda.layout import kernel_layout_extra_bytes, to_kernel_layout
from app.engine.cuda.load_plan import plan_load
from app.engine.cuda.memory import (
    GRAPH_PREFILL_ROWS, MIN_TILE_ELEMENTS, PREFILL_CHUNKS, GpuInfo, MemoryPlan, attention_splits,
)
from app.engine.cuda.ops import default_ops
from app.engine.cuda.prefill import GemmPrefill
from app.engine.cuda.prefill_graphs import PrefillGraphs, prefill_buckets
from app.engine.cuda.weights import (
    DequantTables, ModelWeights, arena_nbytes, module_to_arena, weights_from_model, weights_to_arena,
)
from app.engine.kv_cache import StaticKVCache
from app.engine.layers import rope_tables
from app.engine.loading import LoadedModel, load_model, load_quantized_model
from app.engine.runner import GPU_PREFILL_CHUNK, RunnerCapabilities, RunnerOptions
from app.engine.sampling import RowSampling
from app.errors import QwenTrayError
from app.formats import checkpoint
from app.kernels import loader
from app.kernels.attention import ROPE_WINDOW
from app.kernels.builds import kernel_builds
from app.kernels.dequant import dequant_kernel_or_none
from app.kernels.gemv import MAX_BATCH
from app.kernels.repack import tile_repack_kernel_or_none

# Consecutive tokens of one sequence per decode-graph step at most: the fused RoPE attention
# stages the new rows of a slot within a window of this many positions (attention.cu).
ONE_SLOT_ROWS = ROPE_WINDOW
MAX_SLOTS = MAX_BATCH  # sequences decoded together: a decode step's rows go through the GEMVs


def check_slots(num_slots: int, label: str = "the model") -> None:
    """The CUDA runner decodes at most MAX_SLOTS sequences together (its graphs' rows)."""
    if not 1 <= num_slots <= MAX_SLOTS:
        raise QwenTrayError(f"{label}: the GPU runner decodes 1 to {MAX_SLOTS} requests together, "
                            f"{num_slots} were asked for (lower max_batch_size)")

log = logging.getLogger(__name__)


class CudaRunner:
    def __init__(self, weights: ModelWeights, *, num_slots: int, max_context: int, plan: MemoryPlan | None = None,
                 ops=None, use_graphs: bool | None = None, prefill_mode: str | None = None,
                 dequant_kernel=None, options: RunnerOptions | None = None,
                 prefill_chunk: int = GPU_PREFILL_CHUNK):
        """``prefill_chunk``: tokens of one prompt the scheduler prefills per step (its
        ``capabilities``); the GEMM prefill still runs them ``plan.prefill_chunk`` at a time."""
        check_slots(num_slots)
        weights = to_kernel_layout(weights, in_place=False)  # no-op when the builder converted in place
        self.weights = weights
        self.spec = spec = weights.spec
        self.device = weights.device
        self.options = options = options or RunnerOptions()
        self.ops = ops or default_ops(self.device, options)
        self.plan = plan
        self.max_context, self.num_slots = max_context, num_slots
        self.cache = StaticKVCache(spec, num_slots, max_context, torch.float16, self.device)
        cos, sin = rope_tables(spec, max_context)  # fp32 [P, D]: what the RoPE kernel reads
        self.rope = (cos.to(self.device), sin.to(self.device))
        self.tables = DequantTables(self.device)
        rows = plan.decode_rows if plan else max(num_slots, GRAPH_PREFILL_ROWS)
        splits = plan.attention_splits if plan else self._splits()
        self.buffers = DecodeBuffers.allocate(spec, rows, splits, self.device)
        self._host_inputs = torch.empty((len(INPUT_ROWS), rows), dtype=torch.int32,
                                        pin_memory=self.device.type == "cuda")
        # Marks when the GPU has read _host_inputs (pinned: the copy is asynchronous).
        self._uploaded = torch.cuda.Event() if self.device.type == "cuda" else None
        # Steps launched and not yet collected: their ids come back asynchronously.
        self._in_flight = TokensInFlight(rows, self.device)
        # Sampled tokens drawn after the step (every kind: the kernels need no sort).
        self.draw = DeviceDraw(rows, self.device, ops=self.ops)
        self.capabilities = RunnerCapabilities(pipelined_decode=True, draw_on_device=options.draw_on_device,
                                               max_verify_rows=min(rows, ONE_SLOT_ROWS), prefill_chunk=prefill_chunk)
        self.step = DecodeStep(weights, self.ops, self.cache, self.rope, self.buffers, self.tables, dequant_kernel,
                               options)
        invariant = all(w.quantized for layer in weights.layers for w in (layer.qkv, layer.o, layer.gate_up,
                                                                           layer.down)) and weights.lm_head.quantized
        use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.graphs = DecodeGraphs(self.step, decode_buckets(num_slots, rows, invariant), use_graphs)
        self.prefill_mode = prefill_mode or (plan.prefill_mode if plan else "gemm")
        self.gemm = self.prefill_graphs = None
        if self.prefill_mode == "gemm":
            chunk = plan.prefill_chunk if plan else PREFILL_CHUNKS[0]
            tile = plan.tile_elements if plan else MIN_TILE_ELEMENTS
            self.gemm = GemmPrefill(weights, self.ops, self.cache, self.rope, self.tables, chunk=chunk,
                                    tile_elements=tile, dequant_kernel=dequant_kernel)
            # after the decode graphs; only where the plan counted their pool
            capture = use_graphs and (plan is None or plan.prefill_graph_bytes > 0)
            self.prefill_graphs = PrefillGraphs(self.gemm, prefill_buckets(chunk, max_context), capture)
        # First chunks through the padded bucket path: with graphs only (eagerly, padding just
        # adds work); the tests switch it on without graphs to run that path on the CPU.
        self.padded_prefill = bool(self.prefill_graphs and self.prefill_graphs.graphs)
        self.budget_capped = False  # set by create_cuda_runner; close() lifts the cap

    def _splits(self) -> int:
        if self.device.type != "cuda":
            return 1
        return attention_splits(self.spec, self.max_context, loader.sm_count(self.device))

    # -- the Runner protocol --------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Run ``ids`` at positions start.. of ``slot``; float32 logits [V] (CPU) of the last."""
        self.cache.check_range(slot, start, len(ids))
        if self.gemm is None:
            logits = self._prefill_through_graph(slot, ids, start)
        elif start == 0 and self.padded_prefill:
            logits = self._prefill_bucketed(slot, ids)
        else:
            logits = self.gemm.run(slot, ids, start)
        return logits.to("cpu").float()

    @torch.inference_mode()
    def decode(self, slots: list[int], ids: list[int], positions: list[int]) -> torch.Tensor:
        """One token per sequence; float32 logits [B, V] on the CPU."""
        self._decode(slots, ids, positions)
        return self.buffers.logits[: len(ids)].to("cpu").float()

    def set_sampling(self, slot: int, row: RowSampling | None) -> None:
        """How the decode_tokens steps take ``slot``'s token from now on: drawn as ``row`` says,
        or the argmax (None, or temperature 0)."""
        self.draw.set(slot, row)

    @torch.inference_mode()
    def decode_tokens(self, slots: list[int], ids: list[int], positions: list[int]) -> list[int]:
        """One token per sequence, taken on the GPU (argmax or draw): only B ids cross the bus."""
        self.decode_tokens_launch(slots, ids, positions)
        done = self.decode_tokens_collect()
        return [done[k] for k in zip(slots, positions)]

    @torch.inference_mode()
    def decode_tokens_launch(self, slots: list[int], ids: list[int], positions: list[int]) -> None:
        """Start a step without waiting for it (:meth:`decode_tokens_collect` gets the ids).
        Steps still in flight are waited for and dropped first.

        The scheduler launches the next step before it does this step's bookkeeping
        (detokenizing, stop strings, streaming to clients), so the GPU is not idle meanwhile.
        """
        self._in_flight.drop()
        self._decode(slots, ids, positions, take_tokens=True)
        self._in_flight.record(self.buffers.tokens, slots, positions)

    @torch.inference_mode()
    def decode_tokens_launch_next(self) -> None:
        """Launch the step after the one in flight (same slots, positions + 1), its input ids
        taken on the device from that step's tokens: nothing waits for the host."""
        if len(self._in_flight) != 1:
            raise RuntimeError(f"decode_tokens_launch_next needs exactly one step in flight, "
                               f"got {len(self._in_flight)}")
        slots, positions = self._in_flight.newest()
        positions = [p + 1 for p in positions]
        self._decode(slots, [0] * len(slots), positions, ids_on_device=True, take_tokens=True)
        self._in_flight.record(self.buffers.tokens, slots, positions)

    @property
    def max_verify_rows(self) -> int:
        """Tokens of one sequence :meth:`tokens_rows` takes at most (one step's rows)."""
        return self.capabilities.max_verify_rows

    @torch.inference_mode()
    def tokens_rows(self, slot: int, ids: list[int], start: int, row: RowSampling | None = None) -> list[int]:
        """The token after each of ``ids`` (run at positions start.. of ``slot``), in one step
        whose row j attends to positions 0..start+j: the check of guessed tokens
        (app.engine.lookup). The argmax, or drawn as ``row`` says (each token from its own
        position's uniform number). Bit-equal to decoding the ids one at a time: the kernels'
        rows do not depend on each other or on the batch size (docs/ENGINE_API.md).
        Steps in flight are waited for and dropped first."""
        self._run_one_slot(slot, ids, start)
        n = len(ids)
        self.draw.draw([row] * n, list(range(start, start + n)), self.buffers.logits[:n], self.buffers.tokens[:n])
        return self.buffers.tokens[:n].tolist()

    @torch.inference_mode()
    def logits_rows(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Like :meth:`tokens_rows`, the float32 logits [len(ids), V] on the CPU (for penalties)."""
        self._run_one_slot(slot, ids, start)
        return self.buffers.logits[: len(ids)].to("cpu").float()

    def _run_one_slot(self, slot: int, ids: list[int], start: int) -> None:
        if not 1 <= len(ids) <= self.max_verify_rows:
            raise ValueError(f"a step of one sequence takes 1..{self.max_verify_rows} tokens, got {len(ids)}")
        self.cache.check_range(slot, start, len(ids))
        self._in_flight.drop()
        self._run_rows([(tok, start + j, slot, start + j + 1) for j, tok in enumerate(ids)])

    def decode_tokens_collect(self) -> dict[tuple[int, int], int]:
        """{(slot, position): next token} of the oldest step in flight ({} when none is)."""
        return self._in_flight.collect()

    def decode_tokens_in_flight(self) -> list[tuple[list[int], list[int]]]:
        """(slots, positions) of the decode_tokens steps in flight, oldest first."""
        return self._in_flight.keys()

    def _decode(self, slots: list[int], ids: list[int], positions: list[int], ids_on_device: bool = False,
                take_tokens: bool = False) -> None:
        for slot, pos in zip(slots, positions):
            self.cache.check_range(slot, pos, 1)
        rows = [(tok, pos, slot, pos + 1) for tok, pos, slot in zip(ids, positions, slots)]
        self._run_rows(rows, ids_on_device)
        if take_tokens:
            n = len(slots)
            self.draw.draw(self.draw.for_slots(slots), positions, self.buffers.logits[:n], self.buffers.tokens[:n])

    def _prefill_bucketed(self, slot: int, ids: list[int]) -> torch.Tensor:
        """The first ``largest`` tokens padded to their bucket (a graph replay), the rest eagerly."""
        first = self.prefill_graphs.largest
        logits = self.prefill_graphs.run(slot, ids[:first])
        if len(ids) > first:
            logits = self.gemm.run(slot, ids[first:], first)
        return logits

    def _prefill_through_graph(self, slot: int, ids: list[int], start: int) -> torch.Tensor:
        """Up to ``rows`` (at most ONE_SLOT_ROWS) consecutive tokens per replay; token j attends
        to 0..start+j."""
        step = self.max_verify_rows
        for offset in range(0, len(ids), step):
            chunk = ids[offset:offset + step]
            first = start + offset
            self._run_rows([(tok, first + j, slot, first + j + 1) for j, tok in enumerate(chunk)])
        return self.buffers.logits[len(chunk) - 1]

    def _run_rows(self, rows: list[tuple[int, int, int, int]], ids_on_device: bool = False) -> None:
        """Upload rows of (id, position, slot, seq_len) padded to their bucket, run the step.
        ``ids_on_device``: the ids are the last step's argmax (``buffers.tokens``), not the rows'."""
        bucket = self.graphs.bucket_for(len(rows))
        host = self._host_inputs
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the previous upload has left the pinned buffer
        host.copy_(torch.tensor(rows + [PAD_ROW] * (host.shape[1] - len(rows)), dtype=torch.int32).t())
        self.buffers.inputs.copy_(host, non_blocking=True)
        if self._uploaded is not None:
            self._uploaded.record()
        if ids_on_device:  # in stream order: after the step that wrote them
            self.buffers.inputs[0, : len(rows)].copy_(self.buffers.tokens[: len(rows)])
        self.graphs.run(bucket)

    # -- lifecycle and accounting -------------------------------------------------------------
    def memory_info(self) -> dict:
        info = {"device": str(self.device), "weights_bytes": self.weights.nbytes, "kv_cache_bytes": self.cache.nbytes,
                "decode_buffers_bytes": self.buffers.nbytes, "prefill_mode": self.prefill_mode,
                "prefill_workspace_bytes": self.gemm.nbytes if self.gemm else 0,
                "prefill_graph_buckets": sorted(self.prefill_graphs.graphs) if self.prefill_graphs else [],
                "prefill_graph_reserved_bytes": self.prefill_graphs.reserved_bytes if self.prefill_graphs else 0}
        if self.device.type == "cuda":
            info.update(cuda_allocated_bytes=torch.cuda.memory_allocated(self.device),
                        cuda_reserved_bytes=torch.cuda.memory_reserved(self.device),
                        cuda_peak_reserved_bytes=torch.cuda.max_memory_reserved(self.device))
        if self.plan is not None:
            info.update(self.plan.as_dict())
        return info

    def close(self) -> None:
        self.graphs.close()
        if self.prefill_graphs is not None:
            self.prefill_graphs.close()
        if self.budget_capped:
            torch.cuda.set_per_process_memory_fraction(1.0, _device_index(self.device))
            self.budget_capped = False


def cap_allocator(device: torch.device, budget: int) -> None:
    """Cap PyTorch's allocator at what it holds now + ``budget``: a planning mistake becomes an
    out-of-memory error, never a silent spill into system memory (Windows pages a full card)."""
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, (torch.cuda.memory_reserved(device) + budget) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, _device_index(device))


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()  # "cuda" has no index


def load_packed(path: Path, *, adapter=None, max_context: int | None = None, progress=None,
                verify: bool = False) -> LoadedModel:
    """Load on the CPU in fp16; a quantized checkpoint keeps only its packed tensors."""
    cpu = torch.device("cpu")
    if checkpoint.is_checkpoint(path):
        return load_quantized_model(path, cpu, adapter=adapter, dtype=torch.float16, max_context=max_context,
                                    progress=progress, backend="packed", verify=verify)
    return load_model(path, cpu, adapter=adapter, dtype=torch.float16, max_context=max_context, progress=progress,
                      verify=verify)


def _plan(weights: ModelWeights, nbytes: int, *, num_slots: int, max_context: int, device: torch.device,
          vram_budget: int | None, prefill_mode: str, label: str, use_graphs: bool, fit: bool = False):
    """The VRAM plan (load_plan.plan_load; ``fit``: fewer slots or a shorter context where the
    asked ones do not fit) and the dequantization kernel (None: PyTorch dequantizes), before any
    allocation."""
    check_slots(num_slots, label)
    gpu = GpuInfo.of(device)
    linears = [w for layer in weights.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    dequant, why = dequant_kernel_or_none(device) if any(w.quantized for w in linears) else (None, None)
    if why:
        log.warning("prefill dequantizes with PyTorch ops: %s", why)
    plan = plan_load(weights.spec, nbytes, gpu, num_slots=num_slots, max_context=max_context, vram_budget=vram_budget,
                     label=label, fit=fit, dense_decode=not all(w.quantized for w in linears + [weights.lm_head]),
                     quantized=any(w.quantized for w in linears), torch_dequant=dequant is None,
                     prefill_mode=prefill_mode, prefill_graphs=use_graphs)
    log.info("%s", plan.describe())
    return plan, dequant


def _kernel_layout_in_place(weights: ModelWeights) -> ModelWeights:
    """W4/W3 repacked for the GEMVs inside the runner's own arena (a model module whose buffers
    these are has no compute backend on this path: nothing else reads them)."""
    kernel = None
    if weights.device.type == "cuda":
        kernel, why = tile_repack_kernel_or_none(weights.device)
        if why:
            log.warning("the weights are repacked with PyTorch ops: %s", why)
    weights = to_kernel_layout(weights, in_place=True, repack_kernel=kernel)
    if weights.device.type == "cuda":
        torch.cuda.empty_cache()  # the repack's temporaries must not hold budget the cache needs
    return weights


def _planned_runner(weights: ModelWeights, plan: MemoryPlan, use_graphs: bool, dequant,
                    options: RunnerOptions | None = None, ops=None) -> CudaRunner:
    """The runner of weights already in the arena, with the slots and context the plan chose."""
    return CudaRunner(_kernel_layout_in_place(weights), num_slots=plan.num_slots, max_context=plan.max_context,
                      plan=plan, use_graphs=use_graphs, dequant_kernel=dequant, options=options, ops=ops)


def _build_capped(device: torch.device, budget: int, build) -> CudaRunner:
    cap_allocator(device, budget)
    try:
        runner = build()
    except BaseException:
        torch.cuda.set_per_process_memory_fraction(1.0, _device_index(device))  # (lifts the cap, keeps the error)
        raise
    runner.budget_capped = True
    return runner


def create_cuda_runner(model, *, num_slots: int, max_context: int, device: torch.device,
                       vram_budget: int | None = None, prefill_mode: str = "auto", label: str = "the model",
                       use_graphs: bool = True, fit: bool = False, progress=None,
                       options: RunnerOptions | None = None, fill=None) -> CudaRunner:
    """Plan, then move ``model`` (loaded on the CPU, fp16) into VRAM and build the runner; or,
    with ``fill(progress)`` (app.engine.skeleton), give the tensors of a ``model`` on the meta
    device their places in VRAM and let ``fill`` read the weights into them.

    Raises :class:`app.engine.cuda.memory.VramBudgetError` before anything is allocated on the GPU
    when the model, the cache or the runtime do not fit. ``fit``: load with fewer slots or a
    shorter context where the asked ones do not fit (the runner's num_slots / max_context).
    ``progress(stage, done, total)``: the layers read (with ``fill``), then the kernels built
    (app.kernels.builds: app.progress.KERNELS_STAGE on a first run, else GPU_STAGE).
    """
    module_tensors = {id(t): t for m in model.modules() for store in (m._parameters, m._buffers)
                      for t in store.values() if t is not None}
    weights = weights_from_model(model)
    plan, dequant = _plan(weights, arena_nbytes(list(module_tensors.values())) + kernel_layout_extra_bytes(weights),
                          num_slots=num_slots, max_context=max_context, device=device, vram_budget=vram_budget,
                          prefill_mode=prefill_mode, label=label, use_graphs=use_graphs, fit=fit)
    del module_tensors, weights  # the CPU copies go once the arena holds the weights

    def build() -> CudaRunner:
        module_to_arena(model, device)
        if fill is not None:
            fill(progress)
        with kernel_builds(device, progress):  # compiled on a first run, which takes a while
            return _planned_runner(weights_from_model(model), plan, use_graphs, dequant, options)

    return _build_capped(device, plan.budget_bytes, build)


def runner_for_weights(weights: ModelWeights, *, num_slots: int, max_context: int, device: torch.device,
                       vram_budget: int | None = None, prefill_mode: str = "auto", label: str = "the model",
                       use_graphs: bool = True, dequant: bool = True, fit: bool = False,
                       options: RunnerOptions | None = None, ops=None) -> CudaRunner:
    """Like :func:`create_cuda_runner` for ModelWeights held on the CPU (benchmarks, tests);
    ``ops``: the step's operations instead of the kernels (lab/ablate_step.py)."""
    plan, kernel = _plan(weights, arena_nbytes(weights.unique_tensors()) + kernel_layout_extra_bytes(weights),
                         num_slots=num_slots, max_context=max_context, device=device, vram_budget=vram_budget,
                         prefill_mode=prefill_mode, label=label, use_graphs=use_graphs, fit=fit)

    def build() -> CudaRunner:
        return _planned_runner(weights_to_arena(weights, device), plan, use_graphs, kernel if dequant else None,
                               options, ops)

    return _build_capped(device, plan.budget_bytes, build)
