"""Quantization recipes: which weight gets how many bits, as data.

A recipe is an ordered table of (module-name glob -> bits) over Hugging Face module names
(``model.layers.*.self_attn.q_proj``, ``model.embed_tokens``, ``lm_head`` ...). For each 2-D
``<module>.weight`` the first matching pattern decides its bits (3, 4 or 16 = keep fp16);
a weight no pattern matches gets ``default_bits``. Everything else (norms, biases) stays fp16.
``*`` matches any text, dots included (``fnmatch``).

Users write recipes as TOML or JSON (docs/FORMATS.md)::

    name = "my-7b"
    base = "mixed"      # optional built-in recipe whose rules come after these
    default_bits = 16   # optional
    [bits]
    "model.layers.*.mlp.down_proj" = 4
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from app.errors import QwenTrayError
from app.formats.core import padded_k, quantized_nbytes

VALID_BITS = (3, 4, 16)
FP16_BYTES = 2

_ATTN = "model.layers.*.self_attn.{q,k,v,o}_proj"
TABLES = ("model.embed_tokens", "lm_head")
_MLP = "model.layers.*.mlp.{gate,up,down}_proj"


def _expand(pattern: str, bits: int) -> list[tuple[str, int]]:
    """'a.{x,y}_proj' -> [('a.x_proj', bits), ('a.y_proj', bits)] (brace lists only)."""
    head, _, rest = pattern.partition("{")
    names, _, tail = rest.partition("}")
    return [(f"{head}{n}{tail}", bits) for n in names.split(",")]


@dataclass(frozen=True)
class Recipe:
    name: str
    rules: tuple[tuple[str, int], ...]
    default_bits: int = 16

    def __post_init__(self) -> None:
        if not self.name:
            raise QwenTrayError("recipe: name must not be empty")
        for pattern, bits in self.rules:
            if not isinstance(pattern, str) or not pattern:
                raise QwenTrayError(f"recipe {self.name}: pattern {pattern!r} must be a non-empty string")
            _check_bits(bits, f"recipe {self.name}: bits for {pattern!r}")
        _check_bits(self.default_bits, f"recipe {self.name}: default_bits")

    def bits_for(self, module: str) -> int:
        """Bits of the weight of ``module`` (first matching rule, else ``default_bits``)."""
        for pattern, bits in self.rules:
            if fnmatch.fnmatchcase(module, pattern):
                return bits
        return self.default_bits

    def table_bits(self, module: str, tied: bool) -> int:
        """Bits of ``model.embed_tokens`` / ``lm_head``: a tied table also serves as the head,
        so it gets the larger of the two (the head is the most error-sensitive weight)."""
        bits = self.bits_for(module)
        if tied and module == "model.embed_tokens":
            bits = max(bits, self.bits_for("lm_head"))
        return bits

    def to_data(self, provenance: dict | None = None) -> dict:
        """The recipe as the JSON/TOML data :func:`load_recipe` reads back (rules in order)."""
        data = {"name": self.name, "default_bits": self.default_bits, "bits": dict(self.rules)}
        if provenance:
            data["provenance"] = provenance
        return data


def _check_bits(bits: object, where: str) -> None:
    if isinstance(bits, bool) or bits not in VALID_BITS:
        raise QwenTrayError(f"{where}: must be one of {', '.join(map(str, VALID_BITS))}, got {bits!r}")


BUILTIN_RECIPES: dict[str, Recipe] = {
    # Every linear layer, the embedding and lm_head at 4 bits (Qwen2.5-3B: ~1.5 GiB).
    "w4": Recipe("w4", tuple(_expand(_ATTN, 4) + _expand(_MLP, 4)
                             + [("model.embed_tokens", 4), ("lm_head", 4)])),
    # Attention and lm_head 4-bit, MLP and an untied embedding 3-bit (Qwen2.5-7B: ~2.93 GiB,
    # ~3.3 bpw). The head's error reaches every logit, an embedding row only its token's input:
    # swapping their bits costs nothing on the 7B (equal shapes) and helps (docs/results/quality.md).
    # A tied table is the head too, so it gets the head's bits (Recipe.table_bits).
    "mixed": Recipe("mixed", tuple(_expand(_ATTN, 4) + _expand(_MLP, 3)
                                   + [("model.embed_tokens", 3), ("lm_head", 4)])),
    # Every 2-D weight at 4 bits, whatever its name (catch-all for unknown module names).
    "q4": Recipe("q4", (), default_bits=4),
}


def load_recipe(name_or_path: str | Path) -> Recipe:
    """A built-in recipe by name (``w4``, ``mixed``, ``q4``) or one read from .toml/.json."""
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_RECIPES:
        return BUILTIN_RECIPES[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise QwenTrayError(
            f"recipe {str(name_or_path)!r}: not a built-in recipe ({', '.join(BUILTIN_RECIPES)}) and no such file"
        )
    data = _read_recipe_file(path)
    return _recipe_from_data(data, path)


def _read_recipe_file(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise QwenTrayError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None
    elif suffix == ".toml":
        data = _parse_toml(text, path)
    else:
        raise QwenTrayError(f"{path}: recipe files must end in .toml or .json")
    if not isinstance(data, dict):
        raise QwenTrayError(f"{path}: a recipe must be a table/object at the top level")
    return data


def _parse_toml(text: str, path: Path) -> dict:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise QwenTrayError(f"{path}: TOML recipes need Python 3.11+ or 'pip install tomli'; "
                                "or write the recipe as JSON") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise QwenTrayError(f"{path}: invalid TOML ({e})") from None


def _recipe_from_data(data: dict, path: Path) -> Recipe:
    unknown = set(data) - {"name", "base", "default_bits", "bits", "provenance"}
    if unknown:
        raise QwenTrayError(f"{path}: unknown recipe field(s) {', '.join(sorted(unknown))} "
                            "(known: name, base, default_bits, bits, provenance)")
    table = data.get("bits", {})
    if not isinstance(table, dict):
        raise QwenTrayError(f"{path}: 'bits' must be a table of \"module pattern\" = bits")
    for pattern, bits in table.items():
        _check_bits(bits, f"{path}: bits.{pattern!r}")
    rules = tuple(table.items())
    default_bits = data.get("default_bits", 16)
    base_name = data.get("base")
    if base_name is not None:
        if base_name not in BUILTIN_RECIPES:
            raise QwenTrayError(f"{path}: base {base_name!r} is not a built-in recipe ({', '.join(BUILTIN_RECIPES)})")
        base = BUILTIN_RECIPES[base_name]
        rules += base.rules
        default_bits = data.get("default_bits", base.default_bits)
    _check_bits(default_bits, f"{path}: default_bits")
    if default_bits == 16 and all(bits == 16 for _, bits in rules):  # an empty file, say: a "checkpoint" of fp16
        raise QwenTrayError(f"{path}: the recipe quantizes nothing (every weight stays at 16 bits); give it a "
                            f"base ({', '.join(BUILTIN_RECIPES)}), a [bits] table or default_bits = 4 or 3")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise QwenTrayError(f"{path}: 'name' must be a non-empty string")
    return Recipe(name, rules, default_bits)


# -- planning: bytes and bits per weight of a model under a recipe -------------------------

@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    bits: int  # 3 or 4 (quantized with fp16 scales per 128) or 16 (stored fp16)
    nbytes: int


@dataclass(frozen=True)
class ModelPlan:
    recipe: str
    tensors: tuple[TensorPlan, ...]

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def total_params(self) -> int:
        return sum(_numel(t.shape) for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        """Effective bits per parameter, scales and fp16 norms/biases included."""
        return self.total_bytes * 8 / self.total_params

    @property
    def gib(self) -> float:
        return self.total_bytes / 2**30

    def bytes_by_bits(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for t in self.tensors:
            out[t.bits] = out.get(t.bits, 0) + t.nbytes
        return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_model(recipe: Recipe, tensors: Iterable[tuple[str, tuple[int, ...]]]) -> ModelPlan:
    """Per-tensor bits and bytes of a model (its state-dict names and shapes) under ``recipe``.

    A quantized weight whose K (shape[1]) is not a multiple of 128 is planned as the quantizer
    stores it: K zero-padded to whole groups of 128 (e.g. SmolLM2's hidden size 576 -> 640).
    """
    plans = []
    tensors = list(tensors)
    tied = not any(name == "lm_head.weight" for name, _ in tensors)
    for name, shape in tensors:
        shape = tuple(int(d) for d in shape)
        bits = 16
        if name.endswith(".weight") and len(shape) == 2:
            module = name[: -len(".weight")]
            bits = recipe.table_bits(module, tied) if module in TABLES else recipe.bits_for(module)
        if bits == 16:
            nbytes = _numel(shape) * FP16_BYTES
        else:
            nbytes = quantized_nbytes(shape[0], padded_k(shape[1]), bits)
        plans.append(TensorPlan(name, shape, bits, nbytes))
    return ModelPlan(recipe.name, tuple(plans))


def hf_tensor_shapes(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    """State-dict (name, shape) of a Qwen2 / Llama HF model from its config.json dict.

    Lets a model be planned without reading its weights. A tied model has no ``lm_head``.
    """
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    vocab = config["vocab_size"]
    qkv_bias = config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False))
    mlp_bias = bool(config.get("mlp_bias", False))
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        projections = [("self_attn.q_proj", heads * head_dim, hidden, qkv_bias),
                       ("self_attn.k_proj", kv_heads * head_dim, hidden, qkv_bias),
                       ("self_attn.v_proj", kv_heads * head_dim, hidden, qkv_bias),
                       ("self_attn.o_proj", hidden, heads * head_dim, bool(config.get("attention_bias", False))),
                       ("mlp.gate_proj", inter, hidden, mlp_bias),
                       ("mlp.up_proj", inter, hidden, mlp_bias),
                       ("mlp.down_proj", hidden, inter, mlp_bias)]
        for module, n_out, n_in, bias in projections:
            out.append((f"{p}.{module}.weight", (n_out, n_in)))
            if bias:
                out.append((f"{p}.{module}.bias", (n_out,)))
        out.append((f"{p}.input_layernorm.weight", (hidden,)))
        out.append((f"{p}.post_attention_layernorm.weight", (hidden,)))
    out.append(("model.norm.weight", (hidden,)))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (vocab, hidden)))
    return out


def format_plan(plan: ModelPlan) -> str:
    """A short human summary: bytes per bit width, total GiB and bits per weight."""
    lines = [f"recipe {plan.recipe}: {len(plan.tensors)} tensors, {plan.total_params / 1e9:.2f} B params"]
    for bits, nbytes in sorted(plan.bytes_by_bits().items()):
        label = "fp16" if bits == 16 else f"{bits}-bit"
        lines.append(f"  {label:>6}: {nbytes / 2**30:7.3f} GiB")
    lines.append(f"  total : {plan.gib:7.3f} GiB, {plan.bits_per_weight:.3f} bits/weight")
    return "\n".join(lines)
