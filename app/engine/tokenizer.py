"""Hugging Face ``tokenizer.json`` + the model's Jinja chat template, without transformers.

Rendering follows transformers' ``apply_chat_template`` (sandboxed Jinja, trim/lstrip
blocks, its ``tojson``/``raise_exception``/``strftime_now``) so prompts are token-for-token
what the model was trained on.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from app.errors import ModelLoadError, QwenTrayError

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
# Stand-ins for message contents while the template is rendered (private-use characters).
_CONTENT_MARK = "\ue000{}\ue001"
_CONTENT_MARK_RE = re.compile("\ue000(\\d+)\ue001")


class Tokenizer:
    def __init__(self, backend: HFTokenizer, chat_template: str | None, special: dict[str, str], source: Path):
        self.backend = backend
        self.chat_template = chat_template
        self.special = special
        self.source = source
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        self.special_ids = frozenset(t_id for t_id, tok in added.items() if tok.special)
        self._special_texts = tuple(tok.content for tok in added.values() if tok.special)
        self._plain: HFTokenizer | None = None  # the same vocabulary, reading special-token text as text

    @classmethod
    def from_folder(cls, folder: str | Path) -> Tokenizer:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{path}: file not found (the model folder needs a Hugging Face tokenizer.json)")
        try:
            backend = HFTokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises plain Exception for any parse error
            raise ModelLoadError(f"{path}: cannot read tokenizer ({e})") from None
        config = _read_config(folder / "tokenizer_config.json")
        template = _chat_template(folder, config)
        special = {k: _token_text(config.get(k)) for k in _SPECIAL_KEYS if _token_text(config.get(k))}
        return cls(backend, template, special, folder)

    # -- text <-> ids ---------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as is: special-token text is parsed, no BOS/EOS added."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    # -- chat -----------------------------------------------------------------------------
    def render_chat(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise QwenTrayError(f"{self.source}: the model has no chat template (tokenizer_config.json chat_template)")
        _check_messages(messages)
        template = _compile(self.chat_template)
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   tools=None, documents=None, **self.special)
        except jinja2.TemplateError as e:
            raise QwenTrayError(f"chat template: {e}") from None

    def encode_chat(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        """The rendered chat's ids. Text in a message that spells a control token (``<|im_end|>``)
        stays text, as OpenAI reads content: a selection or a user must not forge a turn."""
        rendered = self.render_chat(messages, add_generation_prompt)
        if not any(t in m["content"] for m in messages for t in self._special_texts):
            return self.encode(rendered)  # the usual case: one pass, token for token as transformers
        return self._encode_contents_as_text(messages, rendered, add_generation_prompt)

    def _encode_contents_as_text(self, messages: list[Message], rendered: str,
                                 add_generation_prompt: bool) -> list[int]:
        """Render with a mark per content, then parse special tokens in the template's text only."""
        marked = [dict(m, content=_CONTENT_MARK.format(i)) for i, m in enumerate(messages)]
        parts = _CONTENT_MARK_RE.split(self.render_chat(marked, add_generation_prompt))  # text, index, text, ...
        for shape in (str, str.strip):  # templates insert content as is or trimmed (Llama 3)
            pieces = [(part, False) if k % 2 == 0 else (shape(messages[int(part)]["content"]), True)
                      for k, part in enumerate(parts)]
            if "".join(text for text, _ in pieces) == rendered:  # the same text; only the parsing differs
                return [i for text, plain in pieces if text
                        for i in (self._plain_backend().encode(text, add_special_tokens=False).ids if plain
                                  else self.encode(text))]
        raise QwenTrayError("a message contains control-token text (such as <|im_end|>) that this model's chat "
                            "template cannot keep as plain text; remove it from the message")

    def _plain_backend(self) -> HFTokenizer:
        if self._plain is None:
            plain = HFTokenizer.from_str(self.backend.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain


def _check_messages(messages: list[Message]) -> None:
    if not isinstance(messages, list) or not messages:
        raise QwenTrayError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise QwenTrayError(f"messages[{i}].role must be 'system', 'user' or 'assistant'")
        if not isinstance(m.get("content"), str):
            raise QwenTrayError(f"messages[{i}].content must be a string")


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _chat_template(folder: Path, config: dict) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():  # transformers >= 4.43 may save the template beside the config
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: use "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes HTML characters; transformers overrides it like this.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise QwenTrayError(f"chat template has a syntax error: {e}") from None
