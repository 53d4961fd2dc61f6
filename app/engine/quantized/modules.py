"""Quantized modules swapped into a :class:`~app.engine.models.decoder.DecoderModel`.

- :class:`QuantLinear` replaces a ``Linear``: it holds the packed tensors of docs/FORMATS.md
  as buffers (``qweight``/``scales`` for W4, ``qlow``/``qhigh``/``scales`` for W3) and an
  fp16-or-wider ``bias``. ``forward`` calls ``self.backend(self, x)``, a function chosen at
  load: the dense backend (:func:`use_dense_backend`, the float32 reference) dequantizes once
  into ``dense_weight`` and runs ``F.linear``; the CPU in bfloat16 keeps 4-bit codes for
  PyTorch's int4 kernel (:func:`use_int4_backend`, cpu_int4.py; :func:`default_backend`
  picks); "packed" (:func:`keep_packed`, the CUDA runner's load) makes no copy: the runner
  reads the packed tensors directly (``module.packed_tensors()``, ``module.in_features``,
  ``module.padded_in_features``) for its GEMV kernels.
- :class:`QuantEmbedding` is a QuantLinear over the ``[vocab, hidden]`` table with a row
  lookup as well; a tied ``lm_head`` is its linear ``forward``.
- :class:`QuantizedDecoderModel` is a DecoderModel whose ``embed``/``logits`` go through
  a QuantEmbedding when the embedding is quantized.

Padding: a weight whose logical K (``in_features``) is not a multiple of 128 is stored with
zero columns up to ``padded_in_features`` (docs/FORMATS.md, "Checkpoint layout"). The
padded columns quantize to exactly 0, so a kernel gives the exact result when it reads an
``x`` zero-padded to ``padded_in_features``; the dense backend simply drops the columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from app.engine.models.decoder import DecoderModel
from app.engine.quantized import cpu_int4
from app.engine.weights import LayerProgress, Target, hf_weight_map, materialize
from app.errors import ModelLoadError
from app.formats.spec import ModelSpec
from app.formats.tensor import FORMATS, QuantizedTensor

Backend = Callable[["QuantLinear", torch.Tensor], torch.Tensor]
LookupBackend = Callable[["QuantEmbedding", torch.Tensor], torch.Tensor]


class QuantLinear(nn.Module):
    """y = x W^T (+ b) with W stored quantized; the arithmetic is the backend's."""

    def __init__(self, qt: QuantizedTensor, in_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        n, padded_k = qt.shape
        if not 0 < in_features <= padded_k or padded_k - in_features >= 128:
            raise ValueError(f"{qt.name}: logical K={in_features} does not fit stored K={padded_k}")
        self.name = qt.name
        self.format = qt.format
        self.bits = qt.bits
        self.out_features = n
        self.in_features = in_features
        self.padded_in_features = padded_k
        for key in FORMATS[qt.format][1]:
            self.register_buffer(key, qt.tensors[key])
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.backend: Backend | None = None
        self.dense_weight: torch.Tensor | None = None  # set by the dense backend only

    def packed_tensors(self) -> dict[str, torch.Tensor]:
        """The format's tensors by name (qweight, scales | qlow, qhigh, scales)."""
        return {key: getattr(self, key) for key in FORMATS[self.format][1]}

    def quantized(self) -> QuantizedTensor:
        return QuantizedTensor(self.format, (self.out_features, self.padded_in_features),
                               self.packed_tensors(), name=self.name)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The logical weight [N, K] (padding columns dropped)."""
        return self.quantized().dequantize(dtype)[:, : self.in_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend is None:
            raise RuntimeError(f"{self.name}: no backend chosen (load the model through load_quantized_model)")
        return self.backend(self, x)

    def extra_repr(self) -> str:
        pad = f" (stored {self.padded_in_features})" if self.padded_in_features != self.in_features else ""
        return f"{self.format}, in={self.in_features}{pad}, out={self.out_features}, bias={self.bias is not None}"


class QuantEmbedding(QuantLinear):
    """A quantized [vocab, hidden] table: ``lookup(ids)`` rows, ``forward(h)`` tied logits."""

    def __init__(self, qt: QuantizedTensor, embedding_dim: int):
        super().__init__(qt, embedding_dim)
        self.num_embeddings = qt.shape[0]
        self.embedding_dim = embedding_dim
        self.lookup_backend: LookupBackend | None = None
        self.compute_dtype = torch.float32

    # evaluate.perplexity and the KV cache read the table's device and dtype.
    @property
    def device(self) -> torch.device:
        return self.scales.device

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.lookup_backend is None:
            raise RuntimeError(f"{self.name}: no backend chosen (load the model through load_quantized_model)")
        return self.lookup_backend(self, ids)


class QuantizedDecoderModel(DecoderModel):
    """DecoderModel whose embedding (and tied head) may be a :class:`QuantEmbedding`."""

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed_tokens, QuantEmbedding):
            return self.embed_tokens.lookup(ids)
        return super().embed(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None and isinstance(self.embed_tokens, QuantEmbedding):
            return self.embed_tokens(hidden)
        return super().logits(hidden)


# -- the dense backend: dequantize once, then plain PyTorch (the CPU path) ----------------

def dense_linear(module: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.dense_weight, module.bias)


def dense_lookup(module: QuantEmbedding, ids: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, module.dense_weight)


def use_dense_backend(model: nn.Module, dtype: torch.dtype) -> None:
    """Give every quantized module of ``model`` a dense ``dtype`` copy of its weight.

    The copy is made from the packed tensors (fp32 math, then cast), so the model computes
    exactly ``F.linear(x, dequantized W)``: the reference the GEMV kernels are held to.
    """
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.dense_weight = module.dequantize(dtype).contiguous()  # [N, K] logical
            module.backend = dense_linear
        if isinstance(module, QuantEmbedding):
            module.lookup_backend = dense_lookup
            module.compute_dtype = dtype


def use_int4_backend(model: nn.Module, dtype: torch.dtype) -> None:
    """Keep the weights at 4 bits for PyTorch's CPU int4 kernel (app.engine.quantized.cpu_int4):
    every quantized module (on the CPU) is repacked for it. A linear's checkpoint tensors are
    dropped once repacked (the kernel's copy replaces them); an embedding keeps them for its
    row lookups."""
    for module in model.modules():
        if not isinstance(module, QuantLinear):
            continue
        packed, scales_zeros = cpu_int4.pack_module(module, dtype)
        module.register_buffer("int4_packed", packed)
        module.register_buffer("int4_scales_zeros", scales_zeros)
        module.backend = cpu_int4.int4_linear
        if isinstance(module, QuantEmbedding):
            module.lookup_backend = cpu_int4.packed_lookup
            module.compute_dtype = dtype
        else:
            for key in FORMATS[module.format][1]:
                delattr(module, key)


def keep_packed(model: nn.Module, dtype: torch.dtype) -> None:
    """No dense copies: the CUDA runner reads the packed tensors and sets its own compute."""


BACKENDS: dict[str, Callable[[nn.Module, torch.dtype], None]] = {
    "dense": use_dense_backend, "int4": use_int4_backend, "packed": keep_packed,
}


def default_backend(device: torch.device, dtype: torch.dtype) -> str:
    """"int4" for bfloat16 on the CPU where PyTorch's int4 kernel passes its check (a quarter of
    the dense backend's memory and traffic), else "dense" (also the float32 reference)."""
    if torch.device(device).type == "cpu" and dtype == torch.bfloat16 and cpu_int4.available():
        return "int4"
    return "dense"


def quantized_nbytes(model: nn.Module) -> int:
    """Bytes of the tensors every quantized module holds: its packed checkpoint tensors (what a
    GPU must hold), or the int4 backend's repacked copy."""
    return sum(t.numel() * t.element_size() for m in model.modules() if isinstance(m, QuantLinear)
               for t in m.buffers(recurse=False))


# -- building a model from checkpoint weights ---------------------------------------------

WeightItem = tuple[str, tuple[int, ...], "QuantizedTensor | torch.Tensor"]  # HF name, logical shape, weight


def build_quantized_model(spec: ModelSpec, weights: Iterable[WeightItem], max_positions: int,
                          device: torch.device, dtype: torch.dtype, *, backend: str = "dense",
                          progress: Callable[[str, int, int], None] | None = None,
                          where: str = "checkpoint") -> QuantizedDecoderModel:
    """A QuantizedDecoderModel on ``device`` from (HF name, logical shape, weight) items.

    Quantized parts of a fused matrix (q/k/v -> qkv_proj, gate/up -> gate_up_proj) are
    concatenated row-wise (groups are per row, so packed rows stack like dense ones); fp16
    tensors are copied into their (fused) parameters in ``dtype``. The skeleton is built on
    the meta device, so no dense weight is ever allocated for a quantized module. Errors
    (a manifest that does not describe this model) start with ``where``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown quantized backend {backend!r} (known: {', '.join(BACKENDS)})")
    try:
        return _build(spec, weights, max_positions, device, dtype, backend, progress)
    except _Mismatch as e:  # errors reading the weights name their file already and pass through
        raise ModelLoadError(f"{where}: {e}") from None


class _Mismatch(ModelLoadError):
    """The weights do not describe the model of the spec."""


def _build(spec, weights, max_positions, device, dtype, backend, progress) -> QuantizedDecoderModel:
    targets = hf_weight_map(spec)
    parts_of: dict[str, int] = {}  # (fused) parameter -> how many checkpoint tensors make it
    for target in targets.values():
        parts_of[target.param] = parts_of.get(target.param, 0) + 1
    with torch.device("meta"):
        model = QuantizedDecoderModel(spec, max_positions).to(dtype)  # (the packed tensors keep theirs)
    quantized: dict[str, list[tuple[int, str, QuantizedTensor, int]]] = {}
    seen: set[str] = set()
    layers = LayerProgress(spec.num_layers, progress)
    for name, shape, weight in weights:
        target = targets.get(name)
        if target is None:
            raise _Mismatch(f"tensor {name!r} is not part of a {spec.architecture} model")
        seen.add(name)
        if isinstance(weight, QuantizedTensor):
            parts = quantized.setdefault(target.param, [])
            parts.append((target.row_offset, name, weight, shape[1]))
            if len(parts) == parts_of[target.param]:  # complete: fused and prepared now, so the file's
                module = _swap_in(model, target.param, _fuse(target.param, parts, targets, device))
                BACKENDS[backend](module, dtype)  # pages and the packed copy go before the next is read
                del quantized[target.param]
        else:  # into its place now: the file's pages go with the file, not at the end
            _write_dense(model, name, target, weight, device)
        layers.tensor_read(name)
    missing = sorted(set(targets) - seen)
    if missing:
        raise _Mismatch(f"lacks tensors {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    for param, parts in quantized.items():  # some parts of it were not quantized: _fuse says so
        _fuse(param, parts, targets, device)
    materialize(model, device)  # the RoPE tables (on the meta device: left as shapes)
    model.init_rope()
    layers.finished()
    return model.eval()


def _fuse(param: str, parts: list[tuple[int, str, QuantizedTensor, int]], targets: dict[str, Target],
          device: torch.device) -> tuple[QuantizedTensor, int]:
    """Row-concatenate the quantized parts of one (fused) parameter -> (tensor, logical K)."""
    expected = sorted(n for n, t in targets.items() if t.param == param)
    names = sorted(name for _, name, _, _ in parts)
    if names != expected:
        raise _Mismatch(f"{param}: parts {', '.join(expected)} must all be quantized with the same bits "
                             f"(quantized: {', '.join(names)})")
    parts = sorted(parts, key=lambda p: p[0])
    first = parts[0][2]
    if any(qt.format != first.format or qt.shape[1] != first.shape[1] or k != parts[0][3] for _, _, qt, k in parts):
        raise _Mismatch(f"{param}: fused parts {', '.join(names)} have different formats or K")
    rows = 0
    for offset, name, qt, _ in parts:
        if offset != rows:
            raise _Mismatch(f"{name}: lands at row {rows} of {param}, the spec puts it at row {offset}")
        rows += qt.shape[0]
    keys = FORMATS[first.format][1]
    tensors = {key: _cat_rows([qt.tensors[key] for _, _, qt, _ in parts], device) for key in keys}  # [sum N, .]
    name = param.removesuffix(".weight")
    return QuantizedTensor(first.format, (rows, first.shape[1]), tensors, name=name), parts[0][3]


def _cat_rows(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The parts stacked by rows on ``device``. Off the CPU each part is copied from the file's
    pages straight into its rows there: ``torch.cat`` first would copy every byte once more on
    the host. (On the meta device shapes only: torch.cat of meta tensors runs a decomposition
    that imports torch._dynamo.)"""
    if device.type == "cpu":
        return torch.cat(parts)
    out = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype, device=device)
    if device.type != "meta":
        row = 0
        for part in parts:
            out[row:row + part.shape[0]].copy_(part)
            row += part.shape[0]
    return out


def _swap_in(model: QuantizedDecoderModel, param: str, fused: tuple[QuantizedTensor, int]) -> QuantLinear:
    qt, k = fused
    if param == "embed_tokens":
        if qt.shape[0] != model.spec.vocab_size or k != model.spec.hidden_size:
            raise _Mismatch(f"model.embed_tokens: shape ({qt.shape[0]}, {k}) does not match the spec")
        del model.embed_tokens  # the meta Parameter; a module takes its name
        model.embed_tokens = QuantEmbedding(qt, k)
        return model.embed_tokens
    path = param.removesuffix(".weight")
    old = model.get_submodule(path)
    if (qt.shape[0], k) != (old.out_features, old.in_features):
        raise _Mismatch(f"{path}: shape ({qt.shape[0]}, {k}) does not match the spec "
                             f"({old.out_features}, {old.in_features})")
    bias = None if old.bias is None else old.bias.data  # its fp16 values, if read already (_write_dense)
    parent, _, attr = path.rpartition(".")
    module = QuantLinear(qt, k, bias)
    setattr(model.get_submodule(parent) if parent else model, attr, module)
    return module


def _write_dense(model: nn.Module, name: str, target: Target, tensor: torch.Tensor, device: torch.device) -> None:
    """An fp16 checkpoint tensor (norm, bias, unquantized weight) into its rows of its parameter,
    which gets its memory on the first write (a quantized module swapped in later keeps it)."""
    path, _, attr = target.param.rpartition(".")
    module = model.get_submodule(path) if path else model
    param = module._parameters[attr]
    if param.is_meta:
        param = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device), requires_grad=False)
        module._parameters[attr] = param
    dest = param.data[target.row_offset:target.row_offset + tensor.shape[0]]
    if dest.shape != tensor.shape:
        raise _Mismatch(f"{name}: shape {tuple(tensor.shape)} does not match the model's {tuple(dest.shape)}")
    dest.copy_(tensor)
