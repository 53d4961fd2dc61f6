"""ModelSpec: the architecture-neutral description of a decoder-only model.

Built once from a Hugging Face folder's ``config.json`` (+ ``generation_config.json``).
Everything downstream (weights, layers, KV cache, kernels) reads this, never the HF config,
so a new architecture is one more ``_from_*`` adapter here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.errors import ModelLoadError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3")


@dataclass(slots=True, frozen=True)
class RopeScaling:
    kind: str = "default"  # one of SUPPORTED_ROPE_SCALING
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int = 8192  # llama3


@dataclass(slots=True, frozen=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v (Qwen2); o_proj never has one here
    mlp_bias: bool = False
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str = "bfloat16"  # the source checkpoint's dtype

    def __post_init__(self) -> None:
        positive = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "head_dim", "max_position_embeddings")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UnsupportedModelError(f"config.json: {name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"config.json: num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise UnsupportedModelError(f"config.json: head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling.kind not in SUPPORTED_ROPE_SCALING:
            raise UnsupportedModelError(
                f"config.json: rope_scaling type {self.rope_scaling.kind!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ROPE_SCALING)})")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        d = dict(d)
        d["rope_scaling"] = RopeScaling(**d.get("rope_scaling", {}))
        d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
        return cls(**d)

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> ModelSpec:
        folder = Path(folder)
        config = _read_json(folder / "config.json")
        gen_path = folder / "generation_config.json"
        generation = _read_json(gen_path) if gen_path.exists() else {}
        return cls.from_hf_config(config, generation, source=folder / "config.json")

    @classmethod
    def from_hf_config(cls, config: dict, generation: dict | None = None, *, source: Path | str = "config.json") -> ModelSpec:
        generation = generation or {}
        archs = config.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: architecture {arch!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
        try:
            return _spec_from_llama_like(arch, config, generation)
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: invalid value ({e})") from None


def _spec_from_llama_like(arch: str, c: dict, generation: dict) -> ModelSpec:
    """Qwen2 and Llama share one layout; they differ in biases, defaults and rope scaling."""
    num_heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    head_dim = c.get("head_dim") or hidden // num_heads
    is_qwen2 = arch == "Qwen2ForCausalLM"
    return ModelSpec(
        architecture=arch,
        vocab_size=int(c["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(c["intermediate_size"]),
        num_layers=int(c["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(c.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=float(_rope_theta(c, default=1_000_000.0 if is_qwen2 else 10_000.0)),
        max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        attention_bias=True if is_qwen2 else bool(c.get("attention_bias", False)),
        mlp_bias=bool(c.get("mlp_bias", False)),
        rope_scaling=_rope_scaling(c),
        eos_token_ids=_eos_ids(c, generation),
        bos_token_id=generation.get("bos_token_id", c.get("bos_token_id")),
        torch_dtype=str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"),
    )


def _rope_theta(c: dict, default: float) -> float:
    # transformers 5 moved rope_theta into rope_parameters; older configs have it top-level.
    params = c.get("rope_parameters") or {}
    return c.get("rope_theta") or params.get("rope_theta") or default


def _rope_scaling(c: dict) -> RopeScaling:
    raw = c.get("rope_scaling") or c.get("rope_parameters") or {}
    kind = raw.get("rope_type") or raw.get("type") or "default"
    if kind == "default":
        return RopeScaling()
    kwargs = {"kind": kind, "factor": float(raw.get("factor", 1.0))}
    if kind == "llama3":
        kwargs.update(
            low_freq_factor=float(raw["low_freq_factor"]),
            high_freq_factor=float(raw["high_freq_factor"]),
            original_max_position_embeddings=int(raw["original_max_position_embeddings"]),
        )
    return RopeScaling(**kwargs)


def _eos_ids(c: dict, generation: dict) -> tuple[int, ...]:
    ids: list[int] = []
    for raw in (generation.get("eos_token_id"), c.get("eos_token_id")):
        for i in raw if isinstance(raw, list) else [raw]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)


def _read_json(path: Path) -> dict:
    if not path.parent.is_dir():
        raise ModelLoadError(f"{path.parent}: model folder not found")
    if not path.is_file():
        raise ModelLoadError(f"{path}: file not found (is this a Hugging Face model folder?)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data
