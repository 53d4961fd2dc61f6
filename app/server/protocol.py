"""OpenAI request bodies in, validated requests out (the response bodies are shapes.py's).

Pure functions and small dataclasses: no sockets, no engine. Anything the engine cannot do
(tools, logprobs, n > 1, images, JSON mode) is refused with a 400 naming the parameter
instead of being silently ignored, so a client never gets an answer to a question it did
not ask.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from app.server.errors import ApiError, invalid_param
from app.server.fields import (NO_TOOLS, boolean, check_known, integer, invalid_type, invalid_value, missing,
                               number, quoted, refuse_unless, unsupported_value)
from app.server.shapes import Kind
# "developer" is OpenAI's newer name for "system"; the chat template only knows "system".
CHAT_ROLES = ("system", "developer", "user", "assistant")
ROLE_ALIASES = {"developer": "system"}
TOOL_ROLES = ("tool", "function")  # OpenAI's roles for tool results: this server calls no tools

# Accepted for compatibility and ignored: they change nothing about the generated text (the
# prompt_cache_* fields are hints for OpenAI's prompt cache; this server keeps none between requests).
IGNORED_FIELDS = frozenset({"user", "store", "metadata", "service_tier", "parallel_tool_calls",
                            "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options",
                            "safety_identifier"})
SAMPLING_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "stop", "seed",
                             "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos"})
COMMON_FIELDS = frozenset({"model", "stream", "stream_options", "n", "logit_bias"}) | SAMPLING_FIELDS | IGNORED_FIELDS
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools",
                               "tool_choice", "functions", "function_call", "response_format", "modalities"}
# OpenAI documents these; this server refuses them (fields.UNSUPPORTED_REASONS says why) unless null.
UNSUPPORTED_CHAT_FIELDS = ("reasoning_effort", "verbosity", "prediction", "audio", "web_search_options", "moderation")
CHAT_FIELDS |= frozenset(UNSUPPORTED_CHAT_FIELDS)
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo", "suffix", "best_of"}
# include_obfuscation pads OpenAI's chunks against network side channels; a loopback server skips it.
STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})
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
    prompt_where: str = "prompt"  # where the client put the token ids: "prompt", or "prompt[0]" for [[ids]]
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
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ApiError(400, f"Request body is not valid JSON: it is not UTF-8 text (byte 0x{byte:02x} at position "
                            f"{exc.start}).", code="invalid_json") from exc
    except ValueError as exc:  # JSONDecodeError, too-long integers, NaN
        raise ApiError(400, f"Request body is not valid JSON: {_json_problem(exc)}.", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.", code="invalid_json")
    if b"\\ud" in raw or b"\\uD" in raw:  # surrogates can only come from escapes; most bodies skip the walk
        _check_unicode(body)
    return body


def _json_problem(exc: ValueError) -> str:
    if "integer string conversion" in str(exc):  # Python's advice in that message means nothing to a client
        return f"an integer has more than {sys.get_int_max_str_digits()} digits"
    return _clip(str(exc))


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
        raise invalid_value(param, f"it contains a lone surrogate (\\u{ord(text[exc.start]):04x}) at character "
                                   f"{exc.start}, which is not valid Unicode text") from exc


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# -- shared fields ---------------------------------------------------------------------------
def _model(body: dict) -> str:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid_type("model", "a string", model)
    if not model:
        raise invalid_param("model", "Missing required parameter: 'model' (the id GET /v1/models lists).",
                            code="missing_model")
    return model


def _stop(body: dict) -> str | tuple[str, ...]:
    """The stop strings; one string stays a string, so that the engine's error names ``stop``, not ``stop[0]``."""
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return stop
    if not isinstance(stop, list):
        raise invalid_type("stop", "a string or an array of strings", stop)
    for i, item in enumerate(stop):
        if not isinstance(item, str):
            raise invalid_type(f"stop[{i}]", "a string", item)
    return tuple(stop)


def _sent(body: dict, names: tuple[str, ...]) -> str:
    """The first of ``names`` the client sent (the last one when it sent none)."""
    return next((n for n in names if body.get(n) is not None), names[-1])


def _max_tokens(body: dict, names: tuple[str, ...]) -> int | None:
    """The answer's limit from whichever of ``names`` the client sent (they must agree)."""
    sent = [(name, integer(body, name)) for name in names if body.get(name) is not None]
    if len({value for _, value in sent}) > 1:
        raise invalid_value(sent[0][0], f"{' and '.join(n for n, _ in sent)} disagree; send only one of them")
    if not sent:
        return None
    name, value = sent[0]
    if value < 1:  # checked here, not by the engine, to name the field the client used
        raise invalid_value(name, "it must be at least 1")
    return value


def _seed(body: dict) -> int | None:
    seed = integer(body, "seed")
    if seed is None:
        return None
    if not -(2**63) <= seed < 2**64:
        raise invalid_value("seed", "it must fit in 64 bits (signed or unsigned)")
    # The sampler hashes the seed modulo 2**64: an unsigned seed is the signed one with the same bits.
    return seed - 2**64 if seed >= 2**63 else seed


def _sampling(body: dict, max_tokens_fields: tuple[str, ...]) -> dict:
    """SamplingParams keyword arguments; range checks are SamplingParams' job."""
    out: dict = {}
    max_tokens = _max_tokens(body, max_tokens_fields)
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = number(body, name)
        if value is not None:
            out[name] = value
    top_k = integer(body, "top_k")
    if top_k is not None:
        out["top_k"] = 0 if top_k == -1 else top_k  # -1 is vLLM's spelling of "off"
    seed = _seed(body)
    if seed is not None:
        out["seed"] = seed
    stop = _stop(body)
    if stop != ():
        out["stop"] = stop
    if boolean(body, "ignore_eos"):
        out["ignore_eos"] = True
    return out


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = boolean(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise invalid_param("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is true.")
    if not isinstance(options, dict):
        raise invalid_type("stream_options", "an object", options)
    check_known(options, STREAM_OPTIONS, where="stream_options.")
    boolean(options, "include_obfuscation", where="stream_options.")  # checked, then ignored
    return stream, boolean(options, "include_usage", where="stream_options.")


# -- chat ------------------------------------------------------------------------------------
def _message_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_type(where, "a string or an array of content parts", content)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise invalid_type(f"{where}[{j}]", "an object", part)
        kind = part.get("type")
        if kind is None:
            raise missing(f"{where}[{j}].type")
        if not isinstance(kind, str):
            raise invalid_type(f"{where}[{j}].type", "a string", kind)
        if kind != "text":
            raise unsupported_value(f"{where}[{j}].type", kind, "reads text parts only")
        if not isinstance(part.get("text"), str):
            raise invalid_type(f"{where}[{j}].text", "a string", part.get("text"))
        texts.append(part["text"])
    return "\n".join(texts)  # parts are paragraphs of one message, as vLLM joins them


def _role(msg: dict, where: str) -> str:
    role = msg.get("role")
    if role is None:
        raise missing(f"{where}.role")
    if not isinstance(role, str):
        raise invalid_type(f"{where}.role", "a string", role)
    if role in TOOL_ROLES:
        raise unsupported_value(f"{where}.role", role, NO_TOOLS)
    if role not in CHAT_ROLES:
        names = ", ".join(quoted(r) for r in CHAT_ROLES[:-1]) + f" and {quoted(CHAT_ROLES[-1])}"
        raise invalid_value(f"{where}.role", f"{quoted(role)} is not a role; supported values are {names}")
    return ROLE_ALIASES.get(role, role)


def parse_messages(raw: object) -> list[dict]:
    if raw is None:
        raise missing("messages")
    if not isinstance(raw, list):
        raise invalid_type("messages", "an array of messages", raw)
    if not raw:
        raise invalid_param("messages", "Invalid 'messages': expected an array with at least one message, but got "
                                        "an empty array instead.", code="empty_array")
    messages = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid_type(where, "an object with role and content", msg)
        role = _role(msg, where)
        for name in ("tool_calls", "function_call"):
            if msg.get(name):
                raise invalid_param(f"{where}.{name}", f"Unsupported parameter: '{where}.{name}' is not supported "
                                                       f"by this server, which {NO_TOOLS}.",
                                    code="unsupported_parameter")
        content = msg.get("content")
        if content is None and role == "assistant":  # OpenAI's assistant messages may leave it out
            content = ""
        elif "content" not in msg:  # absent is missing; an explicit null stays the wrong type
            raise missing(f"{where}.content")
        messages.append({"role": role, "content": _message_text(content, f"{where}.content")})
    return messages


def parse_request(raw: bytes, kind: Kind) -> ApiRequest:
    """A request body as sent to /v1/chat/completions (``kind`` "chat") or /v1/completions."""
    body = decode_body(raw)
    return parse_chat_request(body) if kind == "chat" else parse_completion_request(body)


def parse_chat_request(body: dict) -> ApiRequest:
    check_known(body, CHAT_FIELDS)
    model = _model(body)
    refuse_unless(body, "n", 1, expected="an integer")
    refuse_unless(body, "logprobs", False, expected="a boolean")
    refuse_unless(body, "top_logprobs", 0, expected="an integer")
    refuse_unless(body, "tools", [])
    refuse_unless(body, "functions", [])
    refuse_unless(body, "tool_choice", "none", "auto")
    refuse_unless(body, "function_call", "none", "auto")
    refuse_unless(body, "response_format", {"type": "text"})
    refuse_unless(body, "logit_bias", {})
    refuse_unless(body, "modalities", ["text"])
    for name in UNSUPPORTED_CHAT_FIELDS:
        refuse_unless(body, name)
    messages = parse_messages(body.get("messages"))
    fields = ("max_completion_tokens", "max_tokens")
    sampling = _sampling(body, fields)
    stream, include_usage = _streaming(body)
    return ApiRequest("chat", model, sampling, messages=messages, stream=stream, include_usage=include_usage,
                      max_tokens_param=_sent(body, fields))


# -- completions -----------------------------------------------------------------------------
def _prompt(raw: object, unwrap: bool = True) -> str | list[int]:
    if raw is None:
        raise missing("prompt")
    if isinstance(raw, str):
        if not raw:
            raise invalid_value("prompt", "it must not be empty")
        return raw
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return list(raw)
    if isinstance(raw, list) and len(raw) == 1 and unwrap:  # ["text"] or [[ids]]: one level only
        return _prompt(raw[0], unwrap=False)
    if isinstance(raw, list) and len(raw) > 1:
        raise invalid_param("prompt", "Unsupported value: 'prompt' can only be one prompt on this server, which "
                                      "answers one prompt per request (send one request per prompt).",
                            code="unsupported_value")
    raise invalid_type("prompt", "a non-empty string or an array of token ids", raw)


def parse_completion_request(body: dict) -> ApiRequest:
    check_known(body, COMPLETION_FIELDS)
    model = _model(body)
    refuse_unless(body, "n", 1, expected="an integer")
    refuse_unless(body, "best_of", 1, expected="an integer")
    # Not even 0: OpenAI answers it with the chosen tokens' log probabilities, which the engine does not keep.
    refuse_unless(body, "logprobs", expected="an integer")
    refuse_unless(body, "echo", False, expected="a boolean")
    refuse_unless(body, "suffix", "")
    refuse_unless(body, "logit_bias", {})
    raw_prompt = body.get("prompt")
    prompt = _prompt(raw_prompt)
    nested = isinstance(raw_prompt, list) and len(raw_prompt) == 1 and isinstance(raw_prompt[0], list)
    sampling = _sampling(body, ("max_tokens",))
    stream, include_usage = _streaming(body)
    return ApiRequest("completion", model, sampling, prompt=prompt, prompt_where="prompt[0]" if nested else "prompt",
                      stream=stream, include_usage=include_usage, default_max_tokens=COMPLETION_DEFAULT_MAX_TOKENS)
