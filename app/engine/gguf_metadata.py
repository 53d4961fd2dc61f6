"""GGUF metadata: the file reader with clear errors, the architectures we convert, their
hyperparameters as Hugging Face config fields (used by :mod:`app.engine.gguf_import`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

from app.errors import ModelLoadError, UnsupportedModelError

log = logging.getLogger(__name__)
GGUF_MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file, then a uint32 version


@dataclass(frozen=True)
class _Architecture:
    """What differs between the GGUF architectures we convert."""

    hf_class: str
    model_type: str
    qkv_bias: bool  # q/k/v projections carry biases (Qwen2)
    rope_permuted: bool  # llama.cpp's converter permuted the q/k rows (llama only)


ARCHITECTURES = {
    "llama": _Architecture("LlamaForCausalLM", "llama", qkv_bias=False, rope_permuted=True),
    "qwen2": _Architecture("Qwen2ForCausalLM", "qwen2", qkv_bias=True, rope_permuted=False),
}


# ---------------------------------------------------------------------------------------------
# Reading GGUF metadata (through ReaderField.parts/data, which every gguf>=0.10 has).


def check_gguf_signature(path: Path) -> None:
    """Refuse a file that is not GGUF, by its first bytes, before the gguf reader sees it (the
    reader's numpy errors say nothing to a user), and a GGUF version the reader does not read."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not head:
        raise ModelLoadError(f"{path} is not a GGUF file (it is empty)")
    if not (head.startswith(GGUF_MAGIC) or GGUF_MAGIC.startswith(head)):
        hint = ("; a .safetensors file is part of a model folder: register the folder with "
                "`qwen-tray models add NAME FOLDER`" if path.suffix.lower() == ".safetensors" else "")
        raise ModelLoadError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'){hint}")
    if len(head) < 8:
        raise ModelLoadError(_truncated(path))
    version = int.from_bytes(head[4:], "little")
    if version & 0xFFFF == 0:  # a big-endian file (the reader reads those too)
        version = int.from_bytes(head[4:], "big")
    if version not in READER_SUPPORTED_VERSIONS:
        raise ModelLoadError(f"{path} is a GGUF file of version {version}, which cannot be read here "
                             f"(versions {' and '.join(map(str, READER_SUPPORTED_VERSIONS))})")


def _truncated(path: Path) -> str:
    return f"{path} is truncated or damaged (it ends early or its contents do not add up); download it again"


class GGUFFile:
    """A GGUFReader whose getters raise ModelLoadError naming the file and the key."""

    def __init__(self, path: Path):
        self.path = path
        check_gguf_signature(path)
        try:
            self.reader = GGUFReader(path)
        except (ValueError, KeyError, IndexError, OSError) as exc:
            # Past a valid signature, the reader reports a cut-short file or garbage offsets
            # with these (numpy's words: kept for --verbose, not for the sentence).
            log.info("%s: GGUFReader: %s: %s", path, type(exc).__name__, exc)
            raise ModelLoadError(_truncated(path)) from exc

    def _field(self, key: str, required: bool):
        field = self.reader.fields.get(key)
        if field is None and required:
            raise ModelLoadError(f"{self.path}: GGUF metadata key {key!r} is missing")
        return field

    def number(self, key: str, default: float | None = None, *, required: bool = True):
        field = self._field(key, required and default is None)
        if field is None:
            return default
        if len(field.types) != 1 or field.types[0] in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            raise ModelLoadError(f"{self.path}: GGUF metadata key {key!r} is not a number")
        return field.parts[field.data[0]][0].item()

    def string(self, key: str, *, required: bool = True) -> str | None:
        field = self._field(key, required)
        if field is None:
            return None
        if field.types != [GGUFValueType.STRING]:
            raise ModelLoadError(f"{self.path}: GGUF metadata key {key!r} is not a string")
        return self._decode(key, field.parts[field.data[0]])

    def _decode(self, key: str, raw) -> str:
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelLoadError(f"{self.path}: GGUF metadata key {key!r} is not valid UTF-8") from exc

    def array(self, key: str, *, required: bool = True) -> list:
        field = self._field(key, required)
        if field is None:
            return []
        if len(field.types) != 2 or field.types[0] != GGUFValueType.ARRAY:
            raise ModelLoadError(f"{self.path}: GGUF metadata key {key!r} is not an array")
        if field.types[1] == GGUFValueType.STRING:
            return [self._decode(key, field.parts[i]) for i in field.data]
        return [field.parts[i][0].item() for i in field.data]


@dataclass(frozen=True)
class GGUFHyperparams:
    """The <arch>.* metadata of a GGUF file, as HF config fields."""

    source: str
    arch: str  # a key of ARCHITECTURES
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"{self.source}: {name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(f"{self.source}: {self.num_attention_heads} attention heads are not a "
                                 f"multiple of {self.num_key_value_heads} KV heads")
        if self.head_dim % 2:
            raise ModelLoadError(f"{self.source}: head_dim {self.head_dim} must be even for rotary embeddings")
        if not (self.rope_theta > 0 and self.rms_norm_eps > 0):
            raise ModelLoadError(f"{self.source}: rope freq_base and rms epsilon must be positive")


def read_hyperparams(gguf: GGUFFile, vocab_len: int) -> GGUFHyperparams:
    arch = gguf.string("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(f"{gguf.path}: GGUF architecture {arch!r} is not supported "
                                    f"(supported: {', '.join(ARCHITECTURES)})")
    key = lambda name: f"{arch}.{name}"  # noqa: E731
    if gguf.number(key("expert_count"), 0) > 0:
        raise UnsupportedModelError(f"{gguf.path}: mixture-of-experts {arch} GGUFs are not supported")
    scaling = gguf.string(key("rope.scaling.type"), required=False)
    if scaling not in (None, "none") or "rope_freqs.weight" in {t.name for t in gguf.reader.tensors}:
        raise UnsupportedModelError(f"{gguf.path}: rope scaling ({scaling or 'rope_freqs'}) is not supported")
    hidden = int(gguf.number(key("embedding_length")))
    heads = int(gguf.number(key("attention.head_count")))
    head_dim = int(gguf.number(key("attention.key_length"), hidden // heads))
    if int(gguf.number(key("rope.dimension_count"), head_dim)) != head_dim:
        raise UnsupportedModelError(f"{gguf.path}: partial rotary embeddings ({key('rope.dimension_count')} "
                                    f"!= head_dim {head_dim}) are not supported")
    if arch == "qwen2" and head_dim * heads != hidden:
        raise UnsupportedModelError(f"{gguf.path}: a qwen2 head_dim ({head_dim}) other than hidden size / heads "
                                    "is not supported")
    # Round the float32 metadata to its shortest decimal: 9.999999747e-06 is really 1e-05.
    as_decimal = lambda name, default=None: float(str(np.float32(gguf.number(key(name), default))))  # noqa: E731
    return GGUFHyperparams(
        source=str(gguf.path),
        arch=arch,
        hidden_size=hidden,
        intermediate_size=int(gguf.number(key("feed_forward_length"))),
        num_hidden_layers=int(gguf.number(key("block_count"))),
        num_attention_heads=heads,
        num_key_value_heads=int(gguf.number(key("attention.head_count_kv"), heads)),
        head_dim=head_dim,
        vocab_size=int(gguf.number(key("vocab_size"), vocab_len)),
        max_position_embeddings=int(gguf.number(key("context_length"))),
        rope_theta=as_decimal("rope.freq_base", 10000.0),
        rms_norm_eps=as_decimal("attention.layer_norm_rms_epsilon"),
    )
