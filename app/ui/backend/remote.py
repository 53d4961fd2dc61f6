"""A remote OpenAI-compatible endpoint behind the backend protocol (stdlib http.client + SSE).

No extra run-time dependency: ``POST {base_url}/chat/completions`` with ``stream: true``,
``data:`` lines parsed as they arrive. Cancelling shuts the socket down, which ends the
blocking read in the streaming thread.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

from app.engine.params import GenerationResult, SamplingParams, Usage
from app.errors import QwenTrayError
from app.ui.backend.base import Message


class RemoteBackendError(QwenTrayError):
    """The remote endpoint could not be reached or answered with an error."""


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


def request_body(model: str, messages: list[Message], params: SamplingParams) -> dict:
    body: dict = {
        "model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
    }
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    if params.presence_penalty:
        body["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        body["frequency_penalty"] = params.frequency_penalty
    if params.top_k:
        body["top_k"] = params.top_k  # an extension vLLM, llama.cpp and our server accept
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty
    return body


class RemoteStream:
    """One streaming response; iterate for deltas, then read ``result``."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse,
                 prompt_estimate: int, started: float):
        self._conn, self._response = conn, response
        self._prompt_estimate = prompt_estimate
        self._started = started
        self._cancel = threading.Event()
        self._result: GenerationResult | None = None

    def cancel(self) -> None:
        self._cancel.set()
        sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # unblocks the reader thread
            except OSError:
                pass  # already closed

    def __iter__(self) -> Iterator[str]:
        parts: list[str] = []
        finish, usage, first_at = "stop", None, None
        try:
            for payload in self._events():
                choice = (payload.get("choices") or [{}])[0]
                delta = (choice.get("delta") or {}).get("content") or ""
                if delta:
                    first_at = first_at or time.perf_counter()
                    parts.append(delta)
                    yield delta
                finish = choice.get("finish_reason") or finish
                usage = payload.get("usage") or usage
        except (OSError, http.client.HTTPException) as e:
            if not self._cancel.is_set():
                raise RemoteBackendError(f"remote stream broke off: {e}") from e
        finally:
            self._conn.close()
        if self._cancel.is_set():
            finish = "cancelled"
        self._result = self._make_result("".join(parts), finish, usage, first_at, len(parts))

    def _events(self) -> Iterator[dict]:
        while not self._cancel.is_set():
            line = self._response.readline()
            if not line:
                return
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # comments, event names, blank separators
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                yield json.loads(data)
            except json.JSONDecodeError as e:
                raise RemoteBackendError(f"remote sent a malformed event: {data[:80]!r}") from e

    def _make_result(self, text: str, finish: str, usage: dict | None, first_at: float | None,
                     chunks: int) -> GenerationResult:
        end = time.perf_counter()
        prompt = int(usage.get("prompt_tokens", self._prompt_estimate)) if usage else self._prompt_estimate
        completion = int(usage.get("completion_tokens", chunks)) if usage else chunks
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
                 name: str | None = None, timeout_s: float = 120.0):
        self._url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if self._url.scheme not in ("http", "https") or not self._url.hostname:
            raise RemoteBackendError(f"remote base URL {base_url!r} must look like https://host/v1")
        self.base_url = base_url.rstrip("/")
        self.model, self.api_key = model, api_key
        self.max_context = max_context
        self.name = name or model
        self._timeout_s = timeout_s

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._url.scheme == "https" else http.client.HTTPConnection
        return cls(self._url.hostname, self._url.port, timeout=self._timeout_s)

    def chat(self, messages: list[Message], params: SamplingParams, priority: int) -> RemoteStream:
        del priority  # a remote endpoint has its own scheduling
        body = json.dumps(request_body(self.model, messages, params)).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = self._connection()
        started = time.perf_counter()
        try:
            conn.request("POST", self._url.path + "/chat/completions", body=body, headers=headers)
            response = conn.getresponse()
        except OSError as e:
            conn.close()
            raise RemoteBackendError(f"cannot reach {self.base_url}: {e}") from e
        if response.status >= 400:
            message = _error_message(response.read())
            conn.close()
            raise RemoteBackendError(f"{self.base_url}: HTTP {response.status}: {message}")
        return RemoteStream(conn, response, self.count_chat_tokens(messages), started)

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def count_chat_tokens(self, messages: list[Message]) -> int:
        return sum(estimate_tokens(m["content"]) + 4 for m in messages)  # ~4 tokens of role markup each

    def set_idle_unload(self, seconds: float | None, on_state: Callable[[str], None]) -> None:
        """Nothing to unload: the model runs on the server."""

    def vram_bytes(self) -> int | None:
        return None  # the remote server's memory is not ours to report

    def close(self) -> None:
        pass  # no persistent connection


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace").strip() or "no error message"
