"""A remote OpenAI-compatible endpoint behind the backend protocol, through the ``openai`` SDK.

Why the SDK rather than a hand-written client: it speaks the API's streaming format and raises
one typed error per failure (connection, timeout, 401, 404, 429, other statuses), which become
one sentence each here; it is the client these endpoints are made for; and its HTTP client
honours the system proxy (``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY``, and Windows' and
macOS' own proxy settings through urllib's ``getproxies``). The ``network_proxy`` preference
overrides that: ``"direct"`` (no proxy) or a proxy URL.

No retries (the popup has Retry; a 429 says how long to wait instead); the connection has
``CONNECT_TIMEOUT_S``, each read ``timeout_s``. Cancelling shuts the socket down, which ends the
blocking read in the streaming thread at once.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

import openai

from app.engine.params import GenerationResult, SamplingParams, Usage
from app.errors import QwenTrayError
from app.ui.backend.base import Message

CONNECT_TIMEOUT_S = 10.0
DIRECT = "direct"  # the network_proxy preference: no proxy, whatever the system says


class RemoteBackendError(QwenTrayError):
    """The remote endpoint could not be reached or answered with an error (one sentence)."""


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


def request_arguments(model: str, messages: list[Message], params: SamplingParams) -> dict:
    """The chat-completion arguments for ``params`` (extensions the API lacks go in extra_body)."""
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
    extra = {}
    if params.top_k:
        extra["top_k"] = params.top_k  # an extension vLLM, llama.cpp and our server accept
    if params.repetition_penalty != 1.0:
        extra["repetition_penalty"] = params.repetition_penalty
    if extra:
        args["extra_body"] = extra
    return args


class RemoteStream:
    """One streaming response; iterate for deltas, then read ``result``."""

    def __init__(self, stream: openai.Stream, explain, prompt_estimate: int, started: float):
        self._stream, self._explain = stream, explain
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
        except openai.APIError as e:
            if not self._cancel.is_set():
                raise RemoteBackendError(self._explain(e, streaming=True)) from None
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
            raise RemoteBackendError("the remote stream has not been read to its end")
        return self._result


class RemoteBackend:
    device = "remote"
    kernels_unavailable = None  # the server's own affair

    def __init__(self, base_url: str, model: str, api_key: str = "", max_context: int = 32768,
                 name: str | None = None, timeout_s: float = 120.0, proxy: str = ""):
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise RemoteBackendError(f"remote base URL {base_url!r} must look like https://host/v1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_context = max_context
        self.name = name or model
        self.proxy = proxy  # "" the system's, "direct" none, else this proxy URL
        self._timeout_s = timeout_s
        # No key: the Authorization header is left out (a local server without keys), not sent empty.
        self._auth = {} if api_key else {"extra_headers": {"Authorization": openai.Omit()}}
        timeout = openai.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "none", max_retries=0,
                                     timeout=timeout, http_client=_http_client(proxy, timeout))

    def chat(self, messages: list[Message], params: SamplingParams, priority: int) -> RemoteStream:
        del priority  # a remote endpoint has its own scheduling
        started = time.perf_counter()
        try:
            stream = self._client.chat.completions.create(**request_arguments(self.model, messages, params),
                                                          **self._auth)
        except openai.APIError as e:
            raise RemoteBackendError(self._explain(e)) from None
        return RemoteStream(stream, self._explain, self.count_chat_tokens(messages), started)

    def _explain(self, error: openai.APIError, streaming: bool = False) -> str:
        """One sentence per failure: unreachable, too slow, key refused, no such model, rate-limited."""
        where = self.base_url + (f" through the proxy {self.proxy}" if self.proxy not in ("", DIRECT) else "")
        if isinstance(error, openai.APITimeoutError):
            return f"{where} did not answer within {self._timeout_s:g} s"
        if isinstance(error, openai.APIConnectionError):
            cause = error.__cause__ or error.__context__
            verb = "lost the connection to" if streaming else "cannot reach"
            return f"{verb} {where}" + (f": {cause}" if cause and str(cause) else "")
        message = _server_message(error)
        if isinstance(error, openai.AuthenticationError):
            return f"{self.base_url} refused the API key (HTTP 401: {message}); check the key in Settings → Models"
        if isinstance(error, openai.NotFoundError):
            return (f"{self.base_url} has no model {self.model!r} (HTTP 404: {message}); check the model id and "
                    "the base URL in Settings → Models")
        if isinstance(error, openai.RateLimitError):
            wait = error.response.headers.get("retry-after")
            return (f"{self.base_url} is rate-limiting requests (HTTP 429: {message})"
                    + (f"; try again in {wait} s" if wait else "; try again later"))
        if isinstance(error, openai.APIStatusError):
            return f"{self.base_url}: HTTP {error.status_code}: {message}"
        return f"{self.base_url} sent an error: {message}"

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def count_chat_tokens(self, messages: list[Message]) -> int:
        return sum(estimate_tokens(m["content"]) + 4 for m in messages)  # ~4 tokens of role markup each

    def set_idle_unload(self, seconds: float | None, on_state: Callable[[str], None]) -> None:
        """Nothing to unload: the model runs on the server."""

    def vram_bytes(self) -> int | None:
        return None  # the remote server's memory is not ours to report

    def close(self) -> None:
        self._client.close()


def _http_client(proxy: str, timeout: openai.Timeout) -> openai.DefaultHttpxClient:
    """The SDK's HTTP client (its defaults) with the proxy the preference asks for."""
    if proxy == DIRECT:
        return openai.DefaultHttpxClient(timeout=timeout, trust_env=False)
    if proxy:
        return openai.DefaultHttpxClient(timeout=timeout, proxy=proxy)
    return openai.DefaultHttpxClient(timeout=timeout)  # the system's proxy settings


def _socket_of(response) -> socket.socket | None:
    stream = response.extensions.get("network_stream")
    return stream.get_extra_info("socket") if stream is not None else None


def _server_message(error: openai.APIError) -> str:
    """The server's own error message (OpenAI's shape: {"error": {"message": ...}}), shortened."""
    body = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message") if isinstance(inner, dict) else inner
        if text:
            return str(text)[:200]
    return (error.message or "no error message")[:200]
