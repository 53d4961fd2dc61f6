"""One streaming chat completion: its request arguments, its deltas, its result."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator

import openai

from app.engine.params import GenerationResult, SamplingParams, Usage
from app.remote.errors import RemoteError

# {"role": "system" | "user" | "assistant", "content": str}; typed here, not imported from the
# tray's backend protocol, so the CLI reaches this client without app.ui.
Message = dict[str, str]
ROLE_MARKUP_TOKENS = 4  # about what a chat template adds around each message


def estimate_tokens(text: str) -> int:
    """A deliberately high token estimate for text we cannot tokenize (remote models).

    CJK characters are about one token each; other text is counted as 2.5 UTF-8 bytes per
    token (prose averages about 4, code and punctuation nearer 3), so long text is split
    early rather than sent past the remote model's context.
    """
    cjk = sum(1 for ch in text if "\u3000" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af"
              or "\uf900" <= ch <= "\ufaff")
    other_bytes = len(text.encode("utf-8")) - 3 * cjk
    return cjk + math.ceil(max(other_bytes, 0) / 2.5)


def estimate_chat_tokens(messages: list[Message]) -> int:
    return sum(estimate_tokens(m["content"]) + ROLE_MARKUP_TOKENS for m in messages)


def request_arguments(model: str, messages: list[Message], params: SamplingParams) -> dict:
    """The chat-completion arguments for ``params``: what is off (a neutral value) is left out, so
    strict OpenAI endpoints accept the request; extensions the API lacks go in extra_body."""
    args: dict = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
                  "max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p}
    if params.stop:
        args["stop"] = list(params.stop)
    if params.seed is not None:
        args["seed"] = params.seed
    if params.presence_penalty:
        args["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        args["frequency_penalty"] = params.frequency_penalty
    extra = {}  # extensions vLLM, llama.cpp and our server accept
    if params.top_k:
        extra["top_k"] = params.top_k
    if params.repetition_penalty != 1.0:
        extra["repetition_penalty"] = params.repetition_penalty
    if params.ignore_eos:
        extra["ignore_eos"] = True
    if extra:
        args["extra_body"] = extra
    return args


class RemoteStream:
    """One streaming response; iterate for deltas, then read ``result``. ``cancel()`` may come
    from another thread; closing the iterator early closes the connection too (which cancels
    the generation on a Qwen Tray server)."""

    def __init__(self, stream: openai.Stream, explain: Callable[[Exception], RemoteError],
                 prompt_estimate: int, started: float):
        self._stream, self._explain = stream, explain  # explain: a broken stream's one sentence
        self._prompt_estimate = prompt_estimate
        self._started = started
        self._cancel = threading.Event()
        self._result: GenerationResult | None = None

    def cancel(self) -> None:
        self._cancel.set()
        sock = _socket_of(self._stream.response)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # unblocks the reader thread
            except OSError:
                pass  # already closed

    def __iter__(self) -> Iterator[str]:
        parts: list[str] = []
        finish, usage, first_at = "stop", None, None
        try:
            for chunk in self._stream:
                if self._cancel.is_set():
                    break
                usage = chunk.usage or usage
                if not chunk.choices:
                    continue  # the usage chunk
                choice = chunk.choices[0]
                delta = (choice.delta.content if choice.delta else None) or ""
                if delta:
                    first_at = first_at or time.perf_counter()
                    parts.append(delta)
                    yield delta
                finish = choice.finish_reason or finish
        except (openai.APIError, ValueError) as e:  # ValueError: an event that is not JSON
            if not self._cancel.is_set():
                raise self._explain(e) from None
        finally:
            self._stream.close()
        if self._cancel.is_set():
            finish = "cancelled"
        self._result = self._make_result("".join(parts), finish, usage, first_at, len(parts))

    def _make_result(self, text: str, finish: str, usage, first_at: float | None, chunks: int) -> GenerationResult:
        end = time.perf_counter()
        prompt = usage.prompt_tokens if usage else self._prompt_estimate
        completion = usage.completion_tokens if usage else chunks
        return GenerationResult(
            text=text, finish_reason=finish if finish in ("stop", "length", "cancelled") else "stop",  # type: ignore[arg-type]
            usage=Usage(prompt, completion), token_ids=(),
            time_to_first_token_s=(first_at or end) - self._started, decode_time_s=end - (first_at or end))

    @property
    def result(self) -> GenerationResult:
        if self._result is None:
            raise RemoteError("the remote stream has not been read to its end")
        return self._result


def _socket_of(response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    return stream.get_extra_info("socket") if stream is not None else None
