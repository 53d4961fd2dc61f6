"""OpenAI request bodies in, engine calls out; engine results in, OpenAI response bodies out.

Pure functions and small dataclasses: no sockets, no engine. Anything the engine cannot do
(tools, logprobs, n > 1, images, JSON mode) is refused with a 400 naming the parameter
instead of being silently ignored, so a client never gets an answer to a question it did
not ask.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from app.server.errors import ApiError, invalid_param, unsupported_param

Kind = Literal["chat", "completion"]
CHAT_ROLES = ("system", "user", "assistant")
# OpenAI's newer name for the system role; the chat template only knows "system".
ROLE_ALIASES = {"developer": "system"}

# Accepted for compatibility and ignored: they change nothing about the generated text.
IGNORED_FIELDS = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls",
                            "prompt_cache_key", "safety_identifier"})
SAMPLING_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "stop", "seed",
                             "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos"})
COMMON_FIELDS = frozenset({"model", "stream", "stream_options", "n", "logit_bias"}) | SAMPLING_FIELDS | IGNORED_FIELDS
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                               "tool_choice", "functions", "function_call", "response_format", "modalities"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo", "suffix", "best_of"}
# OpenAI's default for /v1/completions; chat defaults to "until the context is full".
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass(slots=True)
class ApiRequest:
    """A validated request: what to generate from, how to sample, how to answer."""

    kind: Kind
    model: str
    sampling: dict  # SamplingParams keyword arguments; max_tokens only when the client sent it
    messages: list[dict] | None = None  # chat: [{"role", "content": str}]
    prompt: str | list[int] | None = None  # completion: text or token ids
    stream: bool = False
    include_usage: bool = False
    max_tokens_param: str = "max_tokens"  # the field the client limited the answer with
    # Without max_tokens: None = until the context is full (chat), else this many (completions),
    # both cut to the room the prompt leaves.
    default_max_tokens: int | None = None

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


# -- the body --------------------------------------------------------------------------------
def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def decode_body(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400 that says why not.

    Strict JSON (no NaN/Infinity); nesting too deep for the parser and integers too long to
    convert are 400s; so is a lone surrogate escape ("\\ud800") anywhere, which no tokenizer
    or UTF-8 encoder can take.
    """
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        raise ApiError(400, "Request body is not valid JSON: it is nested too deeply.", code="invalid_json") from exc
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, too-long integers, NaN
        raise ApiError(400, f"Request body is not valid JSON: {_clip(str(exc))}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.", code="invalid_json")
    if b"\\ud" in raw or b"\\uD" in raw:  # surrogates can only come from escapes; most bodies skip the walk
        _check_unicode(body)
    return body


def _check_unicode(body: dict) -> None:
    """Every key and string is encodable text; else a 400 naming where (iterative: any depth)."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{key}" if where else key
                _check_text(key, path)
                stack.append((path, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, where)


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        param = _clip(where.encode("ascii", "backslashreplace").decode("ascii"))
        raise invalid_param(param, f"{param}: contains a lone surrogate (\\u{ord(text[exc.start]):04x}) "
                                   f"at character {exc.start}, which is not valid Unicode text") from exc


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _show(value: object) -> str:
    """A client value quoted in an error message, cut short: a 4 MiB value is not echoed back."""
    return _clip(repr(value), 100)


# -- field readers ---------------------------------------------------------------------------
def _number(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_param(name, f"{name}: must be a number, got {_show(value)}")
    try:
        return float(value)
    except OverflowError:  # an integer beyond any float
        raise invalid_param(name, f"{name}: {_show(value)} is out of range") from None


def _integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_param(name, f"{name}: must be an integer, got {_show(value)}")
    return value


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid_param(name, f"{name}: must be true or false, got {_show(value)}")
    return value


def _only(body: dict, name: str, *neutral: object) -> None:
    """Refuse ``name`` unless it is absent or one of the values that ask for nothing extra."""
    if name in body and body[name] is not None and not any(body[name] == v for v in neutral):
        raise unsupported_param(name, f"'{name}'={_show(body[name])} is not supported by this server")


def _check_fields(body: dict, allowed: frozenset[str]) -> None:
    for name in body:
        if name not in allowed:
            shown = _clip(name, 100)
            raise unsupported_param(shown, f"unrecognized request argument {shown!r}")


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_param("model", "model: you must provide a model id (see GET /v1/models)", code="missing_model")
    return model


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise invalid_param("stop", "stop: must be a string or a list of strings")


def _sent(body: dict, names: tuple[str, ...]) -> str:
    """The first of ``names`` the client sent (the last one when it sent none)."""
    return next((n for n in names if body.get(n) is not None), names[-1])


def _sampling(body: dict, max_tokens_fields: tuple[str, ...]) -> dict:
    """SamplingParams keyword arguments; range checks are SamplingParams' job."""
    out: dict = {}
    max_tokens = [(n, _integer(body, n)) for n in max_tokens_fields if body.get(n) is not None]
    if len({v for _, v in max_tokens}) > 1:
        raise invalid_param(max_tokens[0][0], "max_tokens and max_completion_tokens disagree; send one of them")
    if max_tokens:
        out["max_tokens"] = max_tokens[0][1]
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = _number(body, name)
        if value is not None:
            out[name] = value
    top_k = _integer(body, "top_k")
    if top_k is not None:
        out["top_k"] = 0 if top_k == -1 else top_k  # -1 is vLLM's spelling of "off"
    seed = _integer(body, "seed")
    if seed is not None:
        if not -(2**63) <= seed < 2**64:  # 64 bits (app.engine.sampling hashes the seed modulo 2**64)
            raise invalid_param("seed", f"seed: must fit in 64 bits, got {seed}")
        out["seed"] = seed
    stop = _stop(body)
    if stop:
        out["stop"] = stop
    if _boolean(body, "ignore_eos"):
        out["ignore_eos"] = True
    return out


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise invalid_param("stream_options", "stream_options: only allowed when stream is true")
    if not isinstance(options, dict):
        raise invalid_param("stream_options", "stream_options: must be an object")
    for key in options:
        if key != "include_usage":
            raise unsupported_param(f"stream_options.{key}")
    return stream, _boolean(options, "include_usage")


# -- chat ------------------------------------------------------------------------------------
def _message_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_param(where, f"{where}: must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise unsupported_param(f"{where}[{j}].type", f"content part type {kind!r} (only 'text' parts)")
        if not isinstance(part.get("text"), str):
            raise invalid_param(f"{where}[{j}].text", f"{where}[{j}].text: must be a string")
        texts.append(part["text"])
    return "\n".join(texts)  # parts are paragraphs of one message, as vLLM joins them


def parse_messages(raw: object) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise invalid_param("messages", "messages: must be a non-empty list")
    messages = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid_param(where, f"{where}: must be an object with role and content")
        role = msg.get("role")
        if not isinstance(role, str):
            raise invalid_param(f"{where}.role", f"{where}.role: must be a string, got {_show(role)}")
        role = ROLE_ALIASES.get(role, role)
        if role not in CHAT_ROLES:
            raise unsupported_param(f"{where}.role", f"role {_show(msg['role'])} (supported: system, user, assistant)")
        if msg.get("tool_calls") or msg.get("function_call"):
            raise unsupported_param(f"{where}.tool_calls", "tool calls")
        content = msg.get("content")
        if content is None and role == "assistant":
            content = ""
        messages.append({"role": role, "content": _message_text(content, f"{where}.content")})
    return messages


def parse_request(raw: bytes, kind: Kind) -> ApiRequest:
    """A request body as sent to /v1/chat/completions (``kind`` "chat") or /v1/completions."""
    body = decode_body(raw)
    return parse_chat_request(body) if kind == "chat" else parse_completion_request(body)


def parse_chat_request(body: dict) -> ApiRequest:
    _check_fields(body, CHAT_FIELDS)
    model = _model(body)
    _only(body, "n", 1)
    _only(body, "logprobs", False)
    _only(body, "top_logprobs", 0)
    _only(body, "tools", [])
    _only(body, "functions", [])
    _only(body, "tool_choice", "none", "auto")
    _only(body, "function_call", "none", "auto")
    _only(body, "response_format", {"type": "text"})
    _only(body, "logit_bias", {})
    _only(body, "modalities", ["text"])
    messages = parse_messages(body.get("messages"))
    fields = ("max_completion_tokens", "max_tokens")
    sampling = _sampling(body, fields)
    stream, include_usage = _streaming(body)
    return ApiRequest("chat", model, sampling, messages=messages, stream=stream, include_usage=include_usage,
                      max_tokens_param=_sent(body, fields))


# -- completions -----------------------------------------------------------------------------
def _prompt(raw: object, unwrap: bool = True) -> str | list[int]:
    if isinstance(raw, str):
        if not raw:
            raise invalid_param("prompt", "prompt: must not be empty")
        return raw
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return list(raw)
    if isinstance(raw, list) and len(raw) == 1 and unwrap:  # ["text"] or [[ids]]: one level only
        return _prompt(raw[0], unwrap=False)
    if isinstance(raw, list) and len(raw) > 1:
        raise unsupported_param("prompt", "a batch of several prompts (send one request per prompt)")
    raise invalid_param("prompt", "prompt: must be a non-empty string or a list of token ids")


def parse_completion_request(body: dict) -> ApiRequest:
    _check_fields(body, COMPLETION_FIELDS)
    model = _model(body)
    _only(body, "n", 1)
    _only(body, "best_of", 1)
    _only(body, "logprobs", 0, False)
    _only(body, "echo", False)
    _only(body, "suffix", "")
    _only(body, "logit_bias", {})
    prompt = _prompt(body.get("prompt"))
    sampling = _sampling(body, ("max_tokens",))
    stream, include_usage = _streaming(body)
    return ApiRequest("completion", model, sampling, prompt=prompt, stream=stream, include_usage=include_usage,
                      default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)


# -- responses -------------------------------------------------------------------------------
def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(slots=True)
class ResponseBuilder:
    """Builds the bodies of one response; every chunk of a stream shares id and created."""

    kind: Kind
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
            self.id = prefix + uuid.uuid4().hex

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def chunk(self, text: str | None = None, *, first: bool = False, finish_reason: str | None = None) -> dict:
        """One streamed chunk: the first carries the role (chat), the last the finish reason."""
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._envelope(obj, [])
        body["usage"] = usage_dict(prompt_tokens, completion_tokens)
        return body

    def full(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage_dict(prompt_tokens, completion_tokens)
        return body


def models_list(model_id: str, created: int) -> dict:
    return {"object": "list", "data": [model_card(model_id, created)]}


def model_card(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "qwen-tray"}
