"""Runtime weights made up or re-quantized: synthetic models for benchmarks, RTN for tests.

:func:`synthetic_weights` gives random weights with a real model's exact shapes (the speed of
a GEMV does not depend on the values); :func:`write_synthetic_checkpoint` writes such a model
as a real checkpoint folder (what a load from disk is timed on); :func:`quantize_weights` quantizes a dense
:class:`~app.engine.cuda.weights.ModelWeights` by a recipe with round-to-nearest (the
product's quantizer is app.quant); :func:`dequantized_linear` is the fp32 reference of any
weight.
"""

from __future__ import annotations

import torch

import shutil
from pathlib import Path

from app.engine.cuda.weights import LayerWeights, LinearWeight, ModelWeights
from app.formats import checkpoint
from app.formats.core import GROUP_SIZE
from app.formats.spec import ModelSpec
from app.formats.tensor import encode
from app.formats.w3 import dequantize_w3
from app.formats.w4 import dequantize_w4

_HF_NAMES = {"qkv": "self_attn.q_proj", "o": "self_attn.o_proj", "gate_up": "mlp.gate_proj", "down": "mlp.down_proj"}


def recipe_bits(recipe, layer: int, part: str, tied: bool = False) -> int:
    """Bits a recipe gives our fused ``part`` of ``layer`` (its first HF member decides); a tied
    embedding is also the head and gets the quantizer's bits for it (``Recipe.table_bits``)."""
    if part in ("embed", "lm_head"):
        return recipe.table_bits("model.embed_tokens" if part == "embed" else "lm_head", tied)
    return recipe.bits_for(f"model.layers.{layer}.{_HF_NAMES[part]}")


def _random_linear(n: int, k: int, bits: int, bias: bool, name: str, device, gen: torch.Generator,
                   pool: torch.Tensor) -> LinearWeight:
    """Random weights of realistic magnitude: |W x| ~ 0.5 for a unit-RMS x (values do not change speed)."""
    b = (torch.rand(n, generator=gen, device=device) * 0.1 - 0.05).half() if bias else None
    if bits == 16:
        dense = (torch.randn(n, k, generator=gen, device=device) * (0.5 / k ** 0.5)).half()
        return LinearWeight(16, n, k, dense=dense, bias=b, name=name)
    scales = ((torch.rand(n, k // GROUP_SIZE, generator=gen, device=device) + 0.5) * (0.1 / k ** 0.5)).half()

    def words(cols: int) -> torch.Tensor:
        # random words from a pool tiled over the tensor: bytes, not values, set the speed
        return pool.repeat(-(-n * cols // pool.numel()))[: n * cols].view(n, cols)

    if bits == 4:
        return LinearWeight(4, n, k, qa=words(k // 8), scales=scales, bias=b, name=name)
    return LinearWeight(3, n, k, qa=words(k // 16), qb=words(k // 32), scales=scales, bias=b, name=name)


def synthetic_weights(spec: ModelSpec, recipe, device: torch.device | str, seed: int = 0) -> ModelWeights:
    """Random weights with ``spec``'s exact shapes, quantized as ``recipe`` says (benchmarks)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pool = torch.randint(-2**31, 2**31 - 1, (1 << 22,), generator=gen, dtype=torch.int32, device=device)
    h, i = spec.hidden_size, spec.intermediate_size
    qkv_rows = spec.q_size + 2 * spec.kv_size
    layers = []
    for n in range(spec.num_layers):
        def lin(part, rows, cols, bias=False):
            return _random_linear(rows, cols, recipe_bits(recipe, n, part), bias, f"layers.{n}.{part}", device, gen,
                                  pool)
        norm = lambda: (torch.rand(h, generator=gen, device=device) * 0.2 + 0.9).half()  # noqa: E731
        layers.append(LayerWeights(norm(), norm(), lin("qkv", qkv_rows, h, spec.attention_bias),
                                   lin("o", h, spec.q_size), lin("gate_up", 2 * i, h, spec.mlp_bias),
                                   lin("down", h, i, spec.mlp_bias)))
    embed = _random_linear(spec.vocab_size, h, recipe_bits(recipe, 0, "embed", spec.tie_word_embeddings), False,
                           "embed_tokens", device, gen, pool)
    head = embed if spec.tie_word_embeddings else _random_linear(
        spec.vocab_size, h, recipe_bits(recipe, 0, "lm_head"), False, "lm_head", device, gen, pool)
    final = (torch.rand(h, generator=gen, device=device) * 0.2 + 0.9).half()
    return ModelWeights(spec, embed, layers, final, head)


def write_synthetic_checkpoint(spec: ModelSpec, recipe, out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A checkpoint folder (docs/FORMATS.md: manifest, a safetensors file per layer, the
    embeddings file, the tokenizer of ``tokenizer_dir``) of random weights with ``spec``'s shapes,
    quantized as ``recipe`` says; loaded as any checkpoint is (benchmarks of a load from disk)."""
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randint(-2**31, 2**31 - 1, (1 << 22,), generator=gen, dtype=torch.int32)
    files, entries = {}, {}

    def write(file_name: str, shapes: dict[str, tuple[int, ...]]) -> None:
        stored = {}
        for name, shape in shapes.items():
            module = name.removesuffix(".weight")
            bits = recipe.bits_for(module) if len(shape) == 2 else 16
            if bits == 16:
                stored[name] = (torch.rand(shape, generator=gen) * 0.2 + 0.9).half()  # norms, biases
                entries[name] = checkpoint.TensorEntry(file_name, checkpoint.FP16, shape)
                continue
            w = _random_linear(*shape, bits, False, module, "cpu", gen, pool)
            words = {"qweight": w.qa} if bits == 4 else {"qlow": w.qa, "qhigh": w.qb}
            stored.update({f"{module}.{key}": t for key, t in {**words, "scales": w.scales}.items()})
            entries[name] = checkpoint.TensorEntry(file_name, "w4" if bits == 4 else "w3", shape)
        files[file_name] = checkpoint.write_tensor_file(out / file_name, stored)

    for i in range(spec.num_layers):
        write(checkpoint.layer_file(i), _layer_shapes(spec, i))
    tables = {"model.embed_tokens.weight": (spec.vocab_size, spec.hidden_size), "model.norm.weight": (spec.hidden_size,)}
    if not spec.tie_word_embeddings:
        tables["lm_head.weight"] = (spec.vocab_size, spec.hidden_size)
    write(checkpoint.EMBEDDINGS_FILE, tables)
    copied = [name for name in checkpoint.COPIED_FILES if (tokenizer_dir / name).is_file()]
    for name in copied:
        shutil.copy(tokenizer_dir / name, out / name)
    checkpoint.write_manifest(out, checkpoint.Manifest(spec=spec, recipe=recipe, method="synthetic", files=files,
                                                       tensors=entries, copied_files=tuple(copied), model_id=out.name))
    return out


def _layer_shapes(spec: ModelSpec, i: int) -> dict[str, tuple[int, ...]]:
    h, inter, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size
    p = f"model.layers.{i}."
    shapes = {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
    for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        shapes[f"{p}self_attn.{proj}.weight"] = (rows, h)
        if spec.attention_bias:
            shapes[f"{p}self_attn.{proj}.bias"] = (rows,)
    shapes |= {p + "self_attn.o_proj.weight": (h, q), p + "mlp.gate_proj.weight": (inter, h),
               p + "mlp.up_proj.weight": (inter, h), p + "mlp.down_proj.weight": (h, inter)}
    return shapes


def quantize_linear(w: LinearWeight, bits: int) -> LinearWeight:
    """Round-to-nearest W4/W3 of a dense LinearWeight (tests; the product quantizer is app.quant)."""
    if bits == 16 or w.quantized:
        return w
    qt = encode(w.dense.float(), bits, name=w.name)
    t = qt.tensors
    return LinearWeight(bits, w.out_features, w.in_features, qa=t.get("qweight", t.get("qlow")), qb=t.get("qhigh"),
                        scales=t["scales"], bias=w.bias, name=w.name)


def quantize_weights(weights: ModelWeights, recipe) -> ModelWeights:
    layers = [LayerWeights(layer.input_norm, layer.post_norm,
                           *(quantize_linear(getattr(layer, part), recipe_bits(recipe, n, part))
                             for part in ("qkv", "o", "gate_up", "down")))
              for n, layer in enumerate(weights.layers)]
    tied = weights.lm_head is weights.embed
    embed = quantize_linear(weights.embed, recipe_bits(recipe, 0, "embed", tied))
    head = embed if tied else quantize_linear(weights.lm_head, recipe_bits(recipe, 0, "lm_head"))
    return ModelWeights(weights.spec, embed, layers, weights.final_norm, head)


def dequantized_linear(w: LinearWeight) -> torch.Tensor:
    """W [N, K] in fp32 exactly as app.formats dequantizes it (the reference of every path)."""
    if w.bits == 16:
        return w.dense.float()
    dequantize = dequantize_w4 if w.bits == 4 else dequantize_w3
    return dequantize(*w.checkpoint_words(), w.scales, torch.float32)
