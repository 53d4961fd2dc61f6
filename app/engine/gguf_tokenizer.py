"""Build Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) from GGUF metadata.

Only byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are supported: that is
what SmolLM2, Llama 3 and Qwen ship. The pre-tokenizer is chosen to reproduce what llama.cpp
does for the file's ``tokenizer.ggml.pre`` value, so token counts match llama.cpp's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from app.errors import UnsupportedModelError

# llama.cpp's token types (gguf.TokenType); CONTROL tokens are special, USER_DEFINED are
# matched whole in text but are not special.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# llama.cpp splits these pre-tokenizer families first on every single numeric character
# ("\p{N}"), then with the GPT-2 regex. tokenizers' Digits(individual_digits=True) uses
# Unicode's numeric class too, and ByteLevel(use_regex=True) is the GPT-2 regex.
_DIGITS_THEN_GPT2 = frozenset({"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone", "minerva"})
# llama.cpp uses the GPT-2 regex alone for these.
_GPT2_ONLY = frozenset({"gpt2", "default", "mpt", "olmo", "jais"})
# Qwen2's own regex (llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2): single digits, letters with one
# leading non-letter; the same split as Qwen's tokenizer.json.
_QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = frozenset({"qwen2"})
SUPPORTED_PRE_TOKENIZERS = tuple(sorted(_DIGITS_THEN_GPT2 | _GPT2_ONLY | _QWEN2))


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer part of a GGUF file's metadata."""

    source: str  # file name, for error messages
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None

    def __post_init__(self) -> None:
        if self.model != "gpt2":
            raise UnsupportedModelError(
                f"{self.source}: tokenizer.ggml.model {self.model!r} is not supported (only byte-level BPE 'gpt2')")
        if self.pre not in SUPPORTED_PRE_TOKENIZERS:
            raise UnsupportedModelError(
                f"{self.source}: tokenizer.ggml.pre {self.pre!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)})")
        if len(self.token_types) != len(self.tokens):
            raise UnsupportedModelError(
                f"{self.source}: tokenizer.ggml.token_type has {len(self.token_types)} entries "
                f"for {len(self.tokens)} tokens")
        if len(set(self.tokens)) != len(self.tokens):
            raise UnsupportedModelError(f"{self.source}: tokenizer.ggml.tokens has duplicate entries")
        for field, token_id in (("bos", self.bos_id), ("eos", self.eos_id), ("unknown", self.unk_id),
                                ("padding", self.pad_id)):
            if token_id is not None and not 0 <= token_id < len(self.tokens):
                raise UnsupportedModelError(
                    f"{self.source}: tokenizer.ggml.{field}_token_id {token_id} is outside the "
                    f"vocabulary of {len(self.tokens)} tokens")

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of a token string, or None (used to find ``<|im_end|>``)."""
        try:
            return self.tokens.index(text)
        except ValueError:
            return None


class MetadataSource(Protocol):
    """Typed GGUF metadata getters that raise ModelLoadError naming the file and key."""

    path: object

    def number(self, key: str, default: float | None = None, *, required: bool = True): ...
    def string(self, key: str, *, required: bool = True) -> str | None: ...
    def array(self, key: str, *, required: bool = True) -> list: ...


def read_vocab(gguf: MetadataSource) -> GGUFVocab:
    """The tokenizer.* metadata of a GGUF file (see gguf_metadata.GGUFFile)."""
    def optional_id(key: str) -> int | None:
        value = gguf.number(key, required=False)
        return None if value is None else int(value)

    return GGUFVocab(
        source=str(gguf.path),
        model=gguf.string("tokenizer.ggml.model"),
        pre=gguf.string("tokenizer.ggml.pre", required=False) or "default",
        tokens=gguf.array("tokenizer.ggml.tokens"),
        token_types=[int(t) for t in gguf.array("tokenizer.ggml.token_type")],
        merges=gguf.array("tokenizer.ggml.merges"),
        bos_id=optional_id("tokenizer.ggml.bos_token_id"),
        eos_id=optional_id("tokenizer.ggml.eos_token_id"),
        unk_id=optional_id("tokenizer.ggml.unknown_token_id"),
        pad_id=optional_id("tokenizer.ggml.padding_token_id"),
        # llama.cpp adds BOS for BPE vocabularies unless the file says otherwise.
        add_bos=bool(gguf.number("tokenizer.ggml.add_bos_token", True)),
        add_eos=bool(gguf.number("tokenizer.ggml.add_eos_token", False)),
        chat_template=gguf.string("tokenizer.chat_template", required=False),
    )


def build_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The HF pre-tokenizer equivalent to llama.cpp's regex list for ``tokenizer.ggml.pre``."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _QWEN2:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre in _GPT2_ONLY:
        return byte_level
    raise UnsupportedModelError(f"tokenizer.ggml.pre {pre!r} is not supported")


def build_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """A `tokenizers` byte-level BPE whose ids are exactly the GGUF token list's indices."""
    # Merges are stored as "left right"; byte-level tokens never contain a real space.
    merge_pairs = [tuple(m.split(" ", 1)) for m in vocab.merges]
    bpe = models.BPE(vocab={tok: i for i, tok in enumerate(vocab.tokens)}, merges=merge_pairs,
                     fuse_unk=False, byte_fallback=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = build_pre_tokenizer(vocab.pre)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(vocab)
    # Control tokens (<|im_start|>, ...) must be matched whole before BPE and be skippable on
    # decode; user-defined ones are matched whole but are ordinary text.
    tokenizer.add_special_tokens([
        AddedToken(t, special=True, normalized=False)
        for t, kind in zip(vocab.tokens, vocab.token_types) if kind == TOKEN_TYPE_CONTROL
    ])
    tokenizer.add_tokens([
        AddedToken(t, special=False, normalized=False)
        for t, kind in zip(vocab.tokens, vocab.token_types) if kind == TOKEN_TYPE_USER_DEFINED
    ])
    return tokenizer


def _post_processor(vocab: GGUFVocab) -> processors.PostProcessor:
    byte_level = processors.ByteLevel(trim_offsets=False)
    bos = vocab.token(vocab.bos_id) if vocab.add_bos else None
    eos = vocab.token(vocab.eos_id) if vocab.add_eos else None
    if bos is None and eos is None:
        return byte_level

    def sequence(piece: str, type_id: int) -> str:  # e.g. "<s>:0 $A:0 </s>:0"
        parts = [f"${piece}:{type_id}"]
        if bos:
            parts.insert(0, f"{bos}:{type_id}")
        if eos:
            parts.append(f"{eos}:{type_id}")
        return " ".join(parts)

    template = processors.TemplateProcessing(
        single=sequence("A", 0),
        pair=f"{sequence('A', 0)} {sequence('B', 1)}",
        special_tokens=[(t, vocab.tokens.index(t)) for t in dict.fromkeys((bos, eos)) if t],
    )
    return processors.Sequence([byte_level, template])


def build_tokenizer_config(vocab: GGUFVocab, max_length: int) -> dict:
    """tokenizer_config.json: special tokens, BOS/EOS policy and the chat template inline."""
    added_tokens_decoder = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": kind == TOKEN_TYPE_CONTROL}
        for i, (t, kind) in enumerate(zip(vocab.tokens, vocab.token_types))
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    }
    config = {
        # The generic fast class loads tokenizer.json as written; model-specific classes may
        # rebuild the pre-tokenizer and lose llama.cpp's digit splitting.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "bos_token": vocab.token(vocab.bos_id),
        "eos_token": vocab.token(vocab.eos_id),
        "unk_token": vocab.token(vocab.unk_id),
        "pad_token": vocab.token(vocab.pad_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "added_tokens_decoder": added_tokens_decoder,
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return {k: v for k, v in config.items() if v is not None}
