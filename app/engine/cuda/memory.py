"""VRAM planner of the CUDA runtime: everything it will allocate, counted before it allocates.

A 4 GB laptop card has no room for surprises, and Windows does not fail an over-full card:
it silently pages VRAM into system memory and decode drops to a few tokens/s. So the runner
plans weights + KV cache + decode buffers + prefill workspace and graph pool + library overheads against a
budget (``--vram-budget``, default: what the card has free at load minus a margin), refuses
with a one-line :class:`VramBudgetError` that says what would fit, and caps PyTorch's
allocator at the budget so a mistake here is an error, never a spill.

Pure arithmetic over the spec and a :class:`GpuInfo`: the CPU tests plan for the RTX 3050.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass

import torch

from app.errors import QwenTrayError
from app.formats.recipe import BUILTIN_RECIPES, hf_tensor_shapes, plan_model
from app.formats.spec import ModelSpec
from app.kernels import loader
from app.kernels.argmax import ARGMAX_BLOCKS
from app.kernels.attention import default_num_splits
from app.kernels.token_draw import draw_workspace_bytes

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
FP16 = 2

MIN_MARGIN = 256 * MiB  # kept free under the default budget (display, other apps)
MARGIN_FRACTION = 0.05
# Device memory a built runner takes beside PyTorch's allocator, so outside the budget's cap:
# CUDA graph executables and the kernel modules CUDA loads (ours, PyTorch's, cuBLAS's for the
# GEMM prefill). Measured by bench_decode's budget runs (docs/KERNELS.md § Memory plan):
# 164 MiB with the graph prefill (7B mixed), 252 MiB with the GEMM prefill (3B w4). A requested
# budget must leave it free, else loading ends in CUDA's own out-of-memory error; the default
# budget's margin is at least this much.
BESIDE_ALLOCATOR = 256 * MiB
KERNEL_MODULES = 8 * MiB  # CuPy/NVRTC modules of the kernels (code, constants)
GRAPH_POOL = 4 * MiB  # small temporaries captured in the decode graphs (2 MB segments)
LARGE_SEGMENT = 20 * MiB  # the caching allocator serves 1-10 MB tensors from 20 MB segments
GRAPH_PREFILL_ROWS = 8  # decode graph rows at least: the prefill through it runs that many tokens per replay
WIDE_PREFILL_ROWS = 16  # ... or 16 (two mma column blocks per weight pass) when the budget has room
PREFILL_CHUNKS = (512, 256, 128)  # token chunk sizes tried for the dequantize + GEMM prefill
MIN_TILE_ELEMENTS = 1 << 20  # dequantized weight tile of the GEMM prefill (fp16 elements)
MAX_TILE_ELEMENTS = 1 << 25
MIN_CONTEXT = 256
# The shortest context a load fitted to the card may get (fitted_shape): below it the tray's
# summaries and rewrites would cut most texts into pieces.
MIN_FIT_CONTEXT = 1024
TORCH_DEQUANT_BYTES = 4  # uint8 temporaries per weight element of the PyTorch dequantizer
# Drawing a sampled token with PyTorch (app.engine.sampling.sample_rows), fp32 temporaries per
# logit at a temperature alone (scaled logits, probabilities, their cumulative sum). The kernels
# (app.kernels.token_draw) need none; the plan keeps one row's worth as a margin.
DRAW_BYTES_PER_LOGIT = 12
SMALL_SEGMENT = 2 * MiB  # ... tensors up to 1 MB come from 2 MB segments

# Shapes of Qwen2.5-3B (HF config.json) for the "or a smaller model" suggestion.
QWEN25_3B_CONFIG = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, intermediate_size=11008,
                        vocab_size=151936, num_hidden_layers=36, model_type="qwen2", tie_word_embeddings=True)


class VramBudgetError(QwenTrayError):
    """The model, its KV cache and the runtime do not fit the VRAM budget (says what would)."""


@dataclass(frozen=True)
class GpuInfo:
    name: str
    total_bytes: int
    free_bytes: int
    sm_count: int
    capability: tuple[int, int]

    @classmethod
    def of(cls, device) -> GpuInfo:
        props = torch.cuda.get_device_properties(device)
        # Blocks PyTorch's allocator caches (a closed model's, on a model switch) are free to a
        # new plan: hand them back, else the card looks fuller than it is.
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        return cls(props.name, total, free, loader.sm_count(device), (props.major, props.minor))


# The target card: 4 GB, 16 SMs, SM86 (what is free depends on the desktop; ~3.4 GB typical).
RTX_3050_LAPTOP = GpuInfo("NVIDIA GeForce RTX 3050 Laptop GPU", 4 * GiB, int(3.4 * GiB), 16, (8, 6))


def parse_size(text: str, what: str = "--vram-budget") -> int:
    """'3.2GiB', '3200MiB', '3.2G', '800M' or plain bytes -> bytes (G/M are binary too)."""
    try:
        return size_in_bytes(text)
    except ValueError as e:
        raise QwenTrayError(f"{what}: {e}") from None


def size_in_bytes(text: str) -> int:
    """parse_size's parsing, for an argparse type too: ValueError says why ``text`` is no size."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", str(text), re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size like 3.2GiB or 3200MiB")
    unit = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 1 << 40}[match.group(2).upper()]
    value = int(float(match.group(1)) * unit)
    if value <= 0:
        raise ValueError(f"must be more than 0, got {text!r}")
    return value


def gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.2f} GiB"


def default_budget(gpu: GpuInfo) -> int:
    """What is free now, minus a margin, so the card never has to page."""
    return gpu.free_bytes - max(MIN_MARGIN, BESIDE_ALLOCATOR, int(gpu.total_bytes * MARGIN_FRACTION))


def cublas_workspace_bytes(capability: tuple[int, int]) -> int:
    """PyTorch's cuBLAS workspace per stream (32 MiB on SM90, ~8 MiB elsewhere) + cuBLASLt's."""
    base = 32 * MiB if capability == (9, 0) else 4 * MiB * 2 + 16 * KiB * 8
    return base + 1 * MiB


def kv_bytes_per_token(spec: ModelSpec) -> int:
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * FP16


def attention_splits(spec: ModelSpec, max_context: int, sm_count: int) -> int:
    return default_num_splits(spec.num_kv_heads, max_context, sm_count)


def decode_buffer_bytes(spec: ModelSpec, rows: int, splits: int) -> int:
    """Static decode buffers (rows = graph batch): inputs, activations, logits, attention partials,
    the fused norms' chunk sums, the argmax's partials."""
    h, qkv = spec.hidden_size, spec.q_size + 2 * spec.kv_size
    per_row = (2 * h + qkv + 2 * spec.q_size + spec.intermediate_size + spec.vocab_size) * FP16 + 8 + 4 * 4
    per_row += 2 * 4 * 4  # the draw's inputs (cuda/draw.py DRAW_INPUTS) and their pinned upload
    per_row += 2 * -(-h // 16) * 4
    per_row += 8 * ARGMAX_BLOCKS  # the argmax's per-slice maxima and indices
    per_row += draw_workspace_bytes(1)  # the device draw's per-slice softmax and search partials
    attention = spec.num_heads * splits * (spec.head_dim + 2) * 4
    return rows * (per_row + attention)


def draw_bytes(spec: ModelSpec) -> int:
    """One row's temporaries of drawing with PyTorch at a temperature alone (under 1 MB for
    vocabularies up to 262k: a small 2 MB segment). A margin: the kernels draw every row,
    top-k / top-p included, in their workspace (decode_buffer_bytes)."""
    return -(-spec.vocab_size * DRAW_BYTES_PER_LOGIT // SMALL_SEGMENT) * SMALL_SEGMENT


def prefill_activation_bytes(spec: ModelSpec, tokens: int, tile_elements: int) -> int:
    """Activations of one pass of the GEMM prefill over ``tokens`` tokens (an upper bound: the
    attention's and the MLP's are summed, though they are never live together): residual, norm
    and sublayer outputs; qkv, q and the attention's copies of it; the MLP's activation and,
    per gate/up tile, its gate, up and silu(gate) outputs (a tile covers at most I rows)."""
    h, qkv, inter = spec.hidden_size, spec.q_size + 2 * spec.kv_size, spec.intermediate_size
    tile_rows = min(inter, max(1, tile_elements // min(h, inter)))
    return tokens * (3 * h + qkv + 4 * spec.q_size + inter + 3 * tile_rows) * FP16


def prefill_gemm_bytes(spec: ModelSpec, chunk: int, max_context: int, tile_elements: int, capability,
                       torch_dequant: bool) -> int:
    """Peak workspace of the eager dequantize + cuBLAS prefill of one ``chunk`` of tokens."""
    mask = chunk * max_context * (1 + FP16)  # bool mask and its fp16 form for chunks after the first
    tile = tile_elements * (FP16 + (TORCH_DEQUANT_BYTES if torch_dequant else 0))
    return (prefill_activation_bytes(spec, chunk, tile_elements) + mask + tile + cublas_workspace_bytes(capability)
            + LARGE_SEGMENT)


def prefill_graph_bytes(spec: ModelSpec, chunk: int, max_context: int, tile_elements: int, capability,
                        torch_dequant: bool) -> int:
    """What the first-chunk prefill graphs keep reserved for as long as they live, on top of the
    eager workspace (an eager chunk after the first can run while they are held).

    Their private pool: the activations of the largest bucket (min(chunk, context) tokens; no
    mask, a first chunk attends causally) and the PyTorch dequantizer's temporaries when it
    runs; one allocator segment of rounding. The dequantized tile is the eager path's buffer,
    shared; the smaller buckets share the pool. Two cuBLAS workspaces for the capture stream
    (PyTorch keeps one per thread's handle and stream): the loader thread's, which captures the
    largest bucket, and the engine thread's, which captures each smaller one at its first prompt.
    """
    bucket = min(chunk, max_context)
    temporaries = tile_elements * TORCH_DEQUANT_BYTES if torch_dequant else 0
    return (prefill_activation_bytes(spec, bucket, tile_elements) + temporaries
            + 2 * cublas_workspace_bytes(capability) + LARGE_SEGMENT)


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    decode_bytes: int  # static decode buffers + graph pool
    prefill_bytes: int  # 0 when prefill runs through the decode graph
    prefill_graph_bytes: int  # pool of the first-chunk prefill graphs; 0 without them
    fixed_bytes: int  # kernel modules, RoPE tables, cuBLAS for dense decode
    num_slots: int
    max_context: int
    decode_rows: int
    attention_splits: int
    prefill_mode: str  # "gemm" (dequantize + cuBLAS) or "graph" (GEMV kernels, decode_rows tokens a replay)
    prefill_chunk: int  # tokens per GEMM pass
    tile_elements: int  # dequantized weight tile of the GEMM prefill

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_cache_bytes + self.decode_bytes + self.prefill_bytes
                + self.prefill_graph_bytes + self.fixed_bytes)

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.total_bytes

    def as_dict(self) -> dict:
        d = asdict(self)
        return {("planned_" + k if k.endswith("_bytes") and k != "budget_bytes" else k): v for k, v in d.items()
                if k.endswith("_bytes")} | {"vram_budget_bytes": self.budget_bytes}

    def describe(self) -> str:
        return (f"VRAM plan {gib(self.total_bytes)} of {gib(self.budget_bytes)}: weights {gib(self.weights_bytes)}, "
                f"KV cache {gib(self.kv_cache_bytes)} ({self.num_slots} x {self.max_context} tokens), "
                f"decode {self.decode_bytes / MiB:.0f} MiB, "
                f"prefill {self.prefill_mode} {self.prefill_bytes / MiB:.0f} MiB"
                f"{f' ({self.prefill_chunk} tokens a replay)' if self.prefill_mode == 'graph' else ''}"
                f"{f' + graphs {self.prefill_graph_bytes / MiB:.0f} MiB' if self.prefill_graph_bytes else ''}, "
                f"other {self.fixed_bytes / MiB:.0f} MiB")


def plan_memory(spec: ModelSpec, weights_bytes: int, *, num_slots: int, max_context: int, budget_bytes: int,
                gpu: GpuInfo, dense_decode: bool = False, quantized: bool = True, torch_dequant: bool = False,
                prefill_mode: str = "auto", prefill_graphs: bool = True, label: str = "the model") -> MemoryPlan:
    """Fit weights, KV cache and runtime into ``budget_bytes`` or raise :class:`VramBudgetError`.

    ``dense_decode``: some linears run through cuBLAS inside the decode graphs (own workspace).
    ``quantized``: the GEMM prefill dequantizes tiles (a dense model needs no tile).
    ``prefill_graphs``: the GEMM prefill may capture its first chunk in CUDA graphs; the plan
    prefers the GEMM prefill with graphs, then without them, then the graph prefill.
    """
    if prefill_mode not in ("auto", "gemm", "graph"):
        raise QwenTrayError(f"prefill mode must be auto, gemm or graph, got {prefill_mode!r}")
    need = functools.partial(_required, spec, gpu, dense_decode)
    rows, splits, decode, fixed, kv = need(num_slots, max_context)
    left = budget_bytes - weights_bytes - decode - fixed - kv
    if left < 0:
        raise VramBudgetError(_does_not_fit(spec, need, weights_bytes, num_slots, max_context, budget_bytes, label))
    base = dict(budget_bytes=budget_bytes, weights_bytes=weights_bytes, kv_cache_bytes=kv, decode_bytes=decode,
                fixed_bytes=fixed, num_slots=num_slots, max_context=max_context, decode_rows=rows,
                attention_splits=splits)
    if prefill_mode != "graph":
        dequant = torch_dequant and quantized
        for graphs in (True, False) if prefill_graphs else (False,):
            for chunk in PREFILL_CHUNKS:
                tile = _largest_tile(spec, chunk, max_context, left, gpu.capability, quantized, dequant, graphs)
                if tile:
                    workspace, pool = _gemm_prefill_bytes(spec, chunk, max_context, tile, gpu.capability, dequant)
                    return MemoryPlan(**base, prefill_bytes=workspace, prefill_graph_bytes=pool if graphs else 0,
                                      prefill_mode="gemm", prefill_chunk=chunk, tile_elements=tile)
        if prefill_mode == "gemm":
            raise VramBudgetError(f"{label}: no room for the GEMM prefill in the {gib(budget_bytes)} VRAM budget "
                                  f"({gib(left)} left after weights and KV cache); use the graph prefill")
    # 16-row replays when they fit: bigger decode buffers, and a margin for step temporaries
    # that pass 1 MB with the rows (the allocator serves those from 20 MB segments; the 7B
    # measured 12 MB above its plan at 16 rows without it)
    wide_rows, _, wide_decode, _, _ = need(num_slots, max_context, WIDE_PREFILL_ROWS)
    wide_decode += LARGE_SEGMENT
    if wide_rows > rows and weights_bytes + wide_decode + fixed + kv <= budget_bytes:
        base.update(decode_rows=wide_rows, decode_bytes=wide_decode)
    return MemoryPlan(**base, prefill_bytes=0, prefill_graph_bytes=0, prefill_mode="graph",
                      prefill_chunk=base["decode_rows"], tile_elements=0)


def _required(spec: ModelSpec, gpu: GpuInfo, dense_decode: bool, slots: int, context: int,
              min_rows: int = GRAPH_PREFILL_ROWS):
    """(decode rows, attention splits, decode bytes, fixed bytes, KV bytes) for this shape."""
    rows = max(slots, min_rows)
    splits = attention_splits(spec, context, gpu.sm_count)
    decode = decode_buffer_bytes(spec, rows, splits) + GRAPH_POOL + draw_bytes(spec)
    fixed = KERNEL_MODULES + 2 * context * spec.head_dim * 4 + (
        cublas_workspace_bytes(gpu.capability) if dense_decode else 0)
    return rows, splits, decode, fixed, kv_bytes_per_token(spec) * slots * context


def _gemm_prefill_bytes(spec, chunk, max_context, tile, capability, torch_dequant) -> tuple[int, int]:
    """(eager workspace, prefill graph pool) of the GEMM prefill."""
    return (prefill_gemm_bytes(spec, chunk, max_context, tile, capability, torch_dequant),
            prefill_graph_bytes(spec, chunk, max_context, tile, capability, torch_dequant))


def _largest_tile(spec, chunk, max_context, left, capability, quantized, torch_dequant, graphs) -> int:
    """Largest power-of-two tile (>= MIN_TILE_ELEMENTS) whose prefill (with its graphs' pool
    when ``graphs``) fits in ``left``, else 0.

    A bigger tile only saves launches, so it may take at most half of the room left: the
    rest stays free (KV cache growth is planned, fragmentation is not).
    """
    tile = MAX_TILE_ELEMENTS if quantized else MIN_TILE_ELEMENTS
    while tile >= MIN_TILE_ELEMENTS:
        workspace, pool = _gemm_prefill_bytes(spec, chunk, max_context, tile, capability, torch_dequant)
        need = workspace + (pool if graphs else 0)
        limit = left if tile == MIN_TILE_ELEMENTS else left // 2
        if need <= limit:
            return tile
        tile //= 2
    return 0


def _does_not_fit(spec: ModelSpec, need, weights: int, slots: int, context: int, budget: int, label: str) -> str:
    fits = _fits(need, weights, budget)
    _, _, decode, fixed, kv = need(slots, context)
    head = (f"{label} does not fit the VRAM budget of {gib(budget)}: weights {gib(weights)} + KV cache "
            f"{gib(kv)} ({slots} x {context} tokens) + runtime {(decode + fixed) / MiB:.0f} MiB")
    largest_context = _longest_context(fits, slots, MIN_CONTEXT, context)
    if largest_context:
        options = [f"max context {largest_context} at batch size {slots}"]
        largest_slots = _most_slots(fits, context, slots)
        if largest_slots:
            options.append(f"batch size {largest_slots} at context {context}")
        return f"{head}; it fits with {' or '.join(options)}"
    return f"{head}; {_smaller_weights_hint(spec, budget, decode + fixed + kv // slots)}"


def fitted_shape(spec: ModelSpec, weights_bytes: int, *, num_slots: int, max_context: int, budget_bytes: int,
                 gpu: GpuInfo, dense_decode: bool = False,
                 min_context: int = MIN_FIT_CONTEXT) -> tuple[int, int] | None:
    """(slots, context) to load with when ``num_slots`` x ``max_context`` do not fit the budget:
    as many slots as fit at the asked context, else one slot with the longest context that fits
    (a multiple of 16, at least ``min_context``); None when not even that fits."""
    fits = _fits(functools.partial(_required, spec, gpu, dense_decode), weights_bytes, budget_bytes)
    slots = _most_slots(fits, max_context, num_slots)
    if slots:
        return slots, max_context
    context = _longest_context(fits, 1, min_context, max_context)
    return (1, context) if context else None


def _fits(need, weights: int, budget: int):
    """fits(slots, context): weights, KV cache, decode buffers and fixed runtime within ``budget``
    (the prefill then takes what is left, or runs through the decode graph)."""
    return lambda slots, context: weights + sum(need(slots, context)[2:]) <= budget


def _most_slots(fits, context: int, most: int) -> int:
    """The most slots (at most ``most``) that fit at ``context``, or 0."""
    return _largest(lambda n: fits(n, context), 1, most + 1)


def _longest_context(fits, slots: int, shortest: int, longest: int) -> int:
    """The longest context, a multiple of 16 in [shortest, longest], that fits ``slots``, or 0."""
    return _largest(lambda c: fits(slots, c * 16), -(-shortest // 16), longest // 16 + 1) * 16


def _largest(ok, low: int, high: int) -> int:
    """Largest n in [low, high) with ok(n) (ok is monotone: true, then false), or 0."""
    if low >= high or not ok(low):
        return 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def _smaller_weights_hint(spec: ModelSpec, budget: int, other: int) -> str:
    """Built-in recipes of this model, or the 3B model, whose weights would fit."""
    fitting = []
    for name, recipe in BUILTIN_RECIPES.items():
        try:
            nbytes = plan_model(recipe, hf_tensor_shapes(spec_to_hf_config(spec))).total_bytes
        except QwenTrayError:
            continue  # a K that is not a multiple of 128: the recipe does not apply
        if nbytes + other <= budget:
            fitting.append(f"the '{name}' recipe ({gib(nbytes)})")
    small = plan_model(BUILTIN_RECIPES["w4"], hf_tensor_shapes(QWEN25_3B_CONFIG)).total_bytes
    fitting.append(f"a smaller model such as Qwen2.5-3B with 'w4' ({gib(small)})")
    return "would fit: " + ", or ".join(fitting)


def spec_to_hf_config(spec: ModelSpec) -> dict:
    return dict(hidden_size=spec.hidden_size, num_attention_heads=spec.num_heads,
                num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size,
                num_hidden_layers=spec.num_layers, tie_word_embeddings=spec.tie_word_embeddings,
                model_type="qwen2" if spec.attention_bias else "llama", mlp_bias=spec.mlp_bias)


def model_weight_bytes(spec: ModelSpec, recipe_name: str) -> int:
    """Weights of ``spec`` under a built-in recipe, without reading any file (planner tests)."""
    return plan_model(BUILTIN_RECIPES[recipe_name], hf_tensor_shapes(spec_to_hf_config(spec))).total_bytes


def resolve_budget(requested: int | None, gpu: GpuInfo) -> int:
    """The budget to plan against: the requested one (never more than is free, lowered to
    :func:`usable_budget`), else the default."""
    budget = default_budget(gpu) if requested is None else min(requested, usable_budget(gpu))
    if budget <= 0:
        raise VramBudgetError(f"{gpu.name} has only {gib(gpu.free_bytes)} free; close other GPU programs")
    if requested is not None and requested > gpu.free_bytes:
        raise VramBudgetError(f"VRAM budget {gib(requested)} is more than the {gib(gpu.free_bytes)} free on "
                              f"{gpu.name}; lower --vram-budget (an over-full card pages to system memory)")
    return budget


def usable_budget(gpu: GpuInfo) -> int:
    """The most a budget may be here: what is free less what CUDA takes beside the allocator."""
    return gpu.free_bytes - BESIDE_ALLOCATOR
