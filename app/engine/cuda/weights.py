"""The weights of a decoder as the CUDA runtime reads them (app.engine.cuda.runner).

:class:`LinearWeight` is one projection: dense fp16 ``[N, K]`` or packed W4/W3 (layouts in
docs/FORMATS.md). :class:`ModelWeights` is the whole model, taken from a ``DecoderModel``
(dense ``Linear`` or ``app.engine.quantized.modules.QuantLinear``), made up with random packed values
for benchmarks (:func:`synthetic_weights`), or quantized from a dense model for tests.

All tensors of a model live in ONE device allocation (:func:`pack_into_arena`): the caching
allocator rounds every tensor above 1 MB up to its own segment, which on a 4 GB card would
cost tens of megabytes the VRAM planner cannot see.

Dequantization here (:func:`dequantize_rows`, :func:`lookup_rows`) is the dequant kernel's
one launch where one is given (app.kernels.dequant, the tile layout), else plain PyTorch on
uint8 bytes, graph-safe (no host syncs, index tables built up front); both bit-equal to
``app.formats`` (``fp16(q * scale)``): the embedding lookup inside the decode graph and the
prefill GEMM path's weight tiles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace

import torch
from torch import nn

from app.errors import QwenTrayError
from app.formats.core import GROUP_SIZE, even_odd_order
from app.formats.spec import ModelSpec
from app.formats.w4 import PERM4
from app.kernels.dequant import DequantKernel
from app.kernels.loader import KernelArgumentError
from app.kernels.tiles import padded_rows
from app.kernels.w3_tiles import tile_values, unpack_w3_tiles
from app.kernels.w4_tiles import tile_words, unpack_w4_tiles

log = logging.getLogger(__name__)

ARENA_ALIGN = 256  # bytes; the kernels need 16, cuBLAS likes 256


@dataclass(eq=False)
class LinearWeight:
    """y = x W^T (+ bias) with W [N, K] dense fp16 (``bits`` 16) or packed W4/W3.

    ``layout``: "rows" is the checkpoint's (qa = qweight, or qlow + qb = qhigh), "tiles" the
    GEMV's (app.kernels.w4_tiles / w3_tiles: repacked, the same bytes; qa and qb have
    ``padded_rows(N)`` rows, the scales stay [N, K/128])."""

    bits: int
    out_features: int
    in_features: int
    dense: torch.Tensor | None = None  # fp16 [N, K]
    qa: torch.Tensor | None = None  # W4 qweight or tiles [N, K/8] | W3 qlow or tiles a [N, K/16], int32
    qb: torch.Tensor | None = None  # W3 qhigh or tiles b [N, K/32], int32
    scales: torch.Tensor | None = None  # fp16 [N, K/128]
    bias: torch.Tensor | None = None  # fp16 [N]
    name: str = "weight"
    layout: str = "rows"

    def __post_init__(self) -> None:
        n, k = self.out_features, self.in_features
        if self.layout not in ("rows", "tiles") or (self.layout == "tiles" and self.bits == 16):
            raise QwenTrayError(f"{self.name}: layout {self.layout!r} does not fit bits={self.bits}")
        packed_rows = padded_rows(n) if self.layout == "tiles" else n
        if self.bits == 16:
            want = {"dense": ((n, k), torch.float16)}
        elif self.bits in (3, 4):
            if k % GROUP_SIZE:
                raise QwenTrayError(f"{self.name}: packed K={k} is not a multiple of {GROUP_SIZE}")
            want = {"qa": ((packed_rows, k // (8 if self.bits == 4 else 16)), torch.int32),
                    "scales": ((n, k // GROUP_SIZE), torch.float16)}
            if self.bits == 3:
                want["qb"] = ((packed_rows, k // 32), torch.int32)
        else:
            raise QwenTrayError(f"{self.name}: bits must be 3, 4 or 16, got {self.bits}")
        if self.bias is not None:
            want["bias"] = ((n,), torch.float16)
        for attr, (shape, dtype) in want.items():
            t = getattr(self, attr)
            if t is None or tuple(t.shape) != shape or t.dtype != dtype:
                got = None if t is None else (t.dtype, tuple(t.shape))
                raise QwenTrayError(f"{self.name}.{attr}: expected {dtype} {shape}, got {got}")

    @property
    def quantized(self) -> bool:
        return self.bits != 16

    def tensors(self) -> Iterator[torch.Tensor]:
        for attr in ("dense", "qa", "qb", "scales", "bias"):
            t = getattr(self, attr)
            if t is not None:
                yield t

    def checkpoint_words(self) -> tuple[torch.Tensor, ...]:
        """The packed words in the checkpoint's layout, (qweight,) or (qlow, qhigh): what
        app.formats and the kernels' references read (unpacked from the tile layout if need be)."""
        if self.layout == "rows":
            return (self.qa,) if self.bits == 4 else (self.qa, self.qb)
        if self.bits == 4:
            return (unpack_w4_tiles(self.qa, self.out_features),)
        return unpack_w3_tiles(self.qa, self.qb, self.out_features)

    @property
    def weight_nbytes(self) -> int:
        """Bytes read per token for this weight (packed values + scales, or fp16)."""
        return sum(t.numel() * t.element_size() for t in self.tensors() if t is not self.bias)


@dataclass(eq=False)
class LayerWeights:
    input_norm: torch.Tensor  # fp16 [H]
    post_norm: torch.Tensor  # fp16 [H]
    qkv: LinearWeight  # [(Hq + 2 Hkv) D, H], bias on Qwen2
    o: LinearWeight  # [H, Hq D]
    gate_up: LinearWeight  # [2 I, H]: gate rows then up rows
    down: LinearWeight  # [H, I]


@dataclass(eq=False)
class ModelWeights:
    spec: ModelSpec
    embed: LinearWeight  # [V, H]; rows are looked up
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: LinearWeight  # ``embed`` itself when the model ties them
    arena: torch.Tensor | None = field(default=None, repr=False)

    def unique_tensors(self) -> list[torch.Tensor]:
        seen: dict[int, torch.Tensor] = {}
        for t in _walk_tensors(self):
            seen.setdefault(id(t), t)
        return list(seen.values())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.unique_tensors())

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every layer and the head, one embedding row."""
        norms = 2 * self.spec.hidden_size * 2  # two fp16 norm vectors per layer
        per_layer = sum(w.weight_nbytes for w in _linears(self.layers[0])) + norms
        return per_layer * len(self.layers) + self.lm_head.weight_nbytes

    @property
    def device(self) -> torch.device:
        return self.final_norm.device

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> ModelWeights:
        """A copy with every tensor replaced by ``fn(tensor)``; shared tensors stay shared."""
        memo: dict[int, object] = {}
        return _map(self, fn, memo)


def _linears(layer: LayerWeights) -> tuple[LinearWeight, ...]:
    return layer.qkv, layer.o, layer.gate_up, layer.down


def _walk_tensors(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, list):
        for item in obj:
            yield from _walk_tensors(item)
    elif isinstance(obj, (LinearWeight, LayerWeights, ModelWeights)):
        for f in fields(obj):
            if f.name != "arena":
                yield from _walk_tensors(getattr(obj, f.name))


def _map(obj, fn, memo: dict[int, object]):
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, torch.Tensor):
        out = fn(obj)
    elif isinstance(obj, list):
        out = [_map(item, fn, memo) for item in obj]
    elif isinstance(obj, (LinearWeight, LayerWeights, ModelWeights)):
        changes = {f.name: _map(getattr(obj, f.name), fn, memo) for f in fields(obj)
                   if f.name != "arena" and isinstance(getattr(obj, f.name), (torch.Tensor, list, LinearWeight,
                                                                              LayerWeights))}
        out = replace(obj, **changes)
    else:
        out = obj
    memo[id(obj)] = out
    return out


# -- one allocation for all weights ----------------------------------------------------------

def aligned_nbytes(nbytes: int) -> int:
    """Bytes ``nbytes`` takes in the arena (rounded up to ARENA_ALIGN)."""
    return -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN


def arena_nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(aligned_nbytes(t.numel() * t.element_size()) for t in tensors)


def pack_into_arena(tensors: list[torch.Tensor],
                    device: torch.device | str) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Copy ``tensors`` into one uint8 device buffer; returns it and id(tensor) -> view. A meta
    tensor only gets its place (uninitialized: app.engine.skeleton fills it from its file)."""
    arena = torch.empty(arena_nbytes(tensors), dtype=torch.uint8, device=device)
    views: dict[int, torch.Tensor] = {}
    offset = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        view = arena[offset:offset + nbytes].view(t.dtype).view(t.shape)
        if not t.is_meta:
            view.copy_(t)
        views[id(t)] = view
        offset += aligned_nbytes(nbytes)
    return arena, views


def weights_to_arena(weights: ModelWeights, device: torch.device | str) -> ModelWeights:
    arena, views = pack_into_arena(weights.unique_tensors(), device)
    moved = weights.map_tensors(lambda t: views[id(t)])
    moved.arena = arena
    return moved


def module_to_arena(model: nn.Module, device: torch.device | str) -> torch.Tensor:
    """Move every parameter and buffer of ``model`` into one device buffer, in place.

    The module keeps working (its tensors are views of the arena) and the CPU copies are
    released, so a model is never held twice.
    """
    owners: list[tuple[dict, str, torch.Tensor]] = []
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in store.items():
                if t is not None:
                    owners.append((store, name, t))
    unique: dict[int, torch.Tensor] = {}
    for _, _, t in owners:
        unique.setdefault(id(t), t)
    arena, views = pack_into_arena(list(unique.values()), device)
    for store, name, t in owners:
        view = views[id(t)]
        store[name] = nn.Parameter(view, requires_grad=False) if isinstance(t, nn.Parameter) else view
    return arena


# -- reading a DecoderModel -----------------------------------------------------------------

def linear_from_module(module, name: str) -> LinearWeight:
    """A ``Linear`` (dense) or an ``app.engine.quantized.modules.QuantLinear`` (packed) as a LinearWeight."""
    bias = None if getattr(module, "bias", None) is None else module.bias.data.to(torch.float16)
    packed = getattr(module, "packed_tensors", None)
    if packed is None:  # dense Linear, or a tied embedding Parameter
        weight = module if isinstance(module, torch.Tensor) else module.weight
        n, k = weight.shape
        return LinearWeight(16, n, k, dense=weight.data.to(torch.float16), bias=bias, name=name)
    if module.padded_in_features != module.in_features:
        # K padded to whole groups: the kernels would need x padded too. Only small, non-Qwen
        # models have such K; they run dense (their weights are a few MB).
        log.info("%s: K=%d is not a multiple of %d; running it dense", name, module.in_features, GROUP_SIZE)
        shape = (module.out_features, module.in_features)
        dense = (torch.empty(shape, dtype=torch.float16, device="meta") if module.scales.is_meta  # (a plan's shapes)
                 else module.dequantize(torch.float32).half().contiguous())
        return LinearWeight(16, *shape, dense=dense, bias=bias, name=name)
    t = packed()
    qa = t.get("qweight", t.get("qlow"))
    return LinearWeight(module.bits, module.out_features, module.in_features, qa=qa, qb=t.get("qhigh"),
                        scales=t["scales"], bias=bias, name=name)


def weights_from_model(model) -> ModelWeights:
    """The runtime view of a DecoderModel (no copies when the model is already fp16)."""
    layers = []
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            input_norm=layer.input_layernorm.weight.data.half(),
            post_norm=layer.post_attention_layernorm.weight.data.half(),
            qkv=linear_from_module(attn.qkv_proj, f"layers.{i}.qkv_proj"),
            o=linear_from_module(attn.o_proj, f"layers.{i}.o_proj"),
            gate_up=linear_from_module(mlp.gate_up_proj, f"layers.{i}.gate_up_proj"),
            down=linear_from_module(mlp.down_proj, f"layers.{i}.down_proj")))
    embed = linear_from_module(model.embed_tokens, "embed_tokens")
    head = embed if model.lm_head is None else linear_from_module(model.lm_head, "lm_head")
    return ModelWeights(model.spec, embed, layers, model.norm.weight.data.half(), head)


# -- graph-safe dequantization in PyTorch --------------------------------------------------

def _k_order_table(field_of_k: list[int], width: int) -> tuple[list[int], list[int]]:
    """For each k of a word's span: the byte holding its field and the shift inside it."""
    per_byte = 8 // width
    return [f // per_byte for f in field_of_k], [width * (f % per_byte) for f in field_of_k]


def _inverse(order: list[int]) -> list[int]:
    inv = [0] * len(order)
    for f, k in enumerate(order):
        inv[k] = f
    return inv


# field f of a word holds k-offset order[f]; we need, per k, which field: the inverse.
_W4_TABLE = _k_order_table(_inverse(list(PERM4)), 4)  # span 8 k per int32 word
_W3_LOW_TABLE = _k_order_table(_inverse(even_odd_order(16)), 2)  # span 16 k per qlow word
_W3_HIGH_TABLE = _k_order_table(_inverse(even_odd_order(32)), 1)  # span 32 k per qhigh word


class DequantTables:
    """Index/shift tensors on one device, made before any graph capture."""

    def __init__(self, device: torch.device | str):
        def pair(table):
            index, shift = table
            return (torch.tensor(index, dtype=torch.long, device=device),
                    torch.tensor(shift, dtype=torch.uint8, device=device))

        self.w4 = pair(_W4_TABLE)
        self.w3_low = pair(_W3_LOW_TABLE)
        self.w3_high = pair(_W3_HIGH_TABLE)


def _fields(words: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor], span: int, mask: int) -> torch.Tensor:
    """int32 words [R, W] -> unsigned fields in k order, uint8 [R, W * span]."""
    r, w = words.shape
    as_bytes = words.contiguous().view(torch.uint8).view(r, w, 4)  # little-endian bytes of each word
    index, shift = table
    picked = as_bytes[:, :, index]  # [R, W, span]: the byte holding each k's field
    return ((picked >> shift) & mask).view(r, w * span)


def unsigned_values(w: LinearWeight, rows: slice, tables: DequantTables) -> torch.Tensor:
    """Stored unsigned values u (q + 8 or q + 4) of ``rows``, uint8 [R, K] in k order."""
    if w.layout == "tiles":
        ids = torch.arange(*rows.indices(w.out_features), device=w.qa.device)  # a device op: capture-safe
        return _tile_values(w, ids, tables)
    if w.bits == 4:
        return _fields(w.qa[rows], tables.w4, 8, 0xF)
    low = _fields(w.qa[rows], tables.w3_low, 16, 0x3)
    high = _fields(w.qb[rows], tables.w3_high, 32, 0x1)
    return low | (high << 2)


def _tile_values(w: LinearWeight, ids: torch.Tensor, tables: DequantTables) -> torch.Tensor:
    if w.bits == 4:
        return _fields(tile_words(w.qa, ids), tables.w4, 8, 0xF)
    return tile_values(w.qa, w.qb, ids)


def dequantize_values(u: torch.Tensor, scales: torch.Tensor, bits: int,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """u uint8 [R, K] and fp16 scales [R, K/128] -> fp16(q * scale) [R, K] (exact as app.formats)."""
    r, k = u.shape
    w = out if out is not None else torch.empty((r, k), dtype=torch.float16, device=u.device)
    w.copy_(u)  # small integers: exact in fp16
    w.sub_(8 if bits == 4 else 4)
    w.view(r, k // GROUP_SIZE, GROUP_SIZE).mul_(scales.unsqueeze(-1))  # one rounding: fp16(q * s)
    return w


def dequantize_rows(w: LinearWeight, start: int, stop: int, tables: DequantTables,
                    out: torch.Tensor | None = None, kernel: DequantKernel | None = None) -> torch.Tensor:
    """Rows start..stop-1 of W as fp16 [R, K]; through ``kernel`` into ``out`` where given."""
    if not w.quantized:
        return w.dense[start:stop]
    if kernel is not None:
        if w.layout != "tiles":
            raise KernelArgumentError(f"{w.name}: the dequantizer reads the tile layout "
                                      "(app.engine.cuda.layout.to_kernel_layout)")
        return kernel.rows(w.bits, w.qa, w.qb, w.scales, start, stop, out)
    rows = slice(start, stop)
    return dequantize_values(unsigned_values(w, rows, tables), w.scales[rows], w.bits, out)


def lookup_rows(w: LinearWeight, ids: torch.Tensor, tables: DequantTables, out: torch.Tensor,
                kernel: DequantKernel | None = None) -> torch.Tensor:
    """Embedding rows ``ids`` (int32 [B]) of table ``w`` into ``out`` fp16 [B, H] (graph-safe):
    ``kernel``'s one launch where it reads ``w`` (packed, tile layout), else PyTorch (the same bits)."""
    if kernel is not None and w.quantized and w.layout == "tiles" and ids.dtype == torch.int32:
        return kernel.lookup(w.bits, w.qa, w.qb, w.scales, ids, out)
    if not w.quantized:
        return torch.index_select(w.dense, 0, ids, out=out)
    if w.layout == "tiles":
        u = _tile_values(w, ids.long(), tables)
        return dequantize_values(u, w.scales.index_select(0, ids), w.bits, out)
    picked = LinearWeight(w.bits, ids.shape[0], w.in_features, qa=w.qa.index_select(0, ids),
                          qb=None if w.qb is None else w.qb.index_select(0, ids),
                          scales=w.scales.index_select(0, ids), name=w.name)
    return dequantize_values(unsigned_values(picked, slice(None), tables), picked.scales, w.bits, out)
