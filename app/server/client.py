"""A minimal streaming chat client for ``qwen-tray ask --server URL`` (stdlib only).

Works against this server or any OpenAI-compatible endpoint. Closing the iterator early
closes the connection, which cancels the generation on a Qwen Tray server.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from app.errors import QwenTrayError
from app.server.sse import DONE, iter_event_data

API_KEY_ENV = "QWEN_TRAY_API_KEY"
_PARAM_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "seed", "stop", "ignore_eos")
# Values that mean "off"; left out of the request so strict OpenAI servers accept it.
_NEUTRAL = {"top_k": 0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "seed": None, "stop": (), "ignore_eos": False}


class ServerConnectionError(QwenTrayError):
    """The server cannot be reached (wrong URL, not running)."""


class ServerRequestError(QwenTrayError):
    """The server answered with an error (its OpenAI error message is kept)."""

    def __init__(self, message: str, *, status: int, code: str | None):
        super().__init__(message)
        self.status = status
        self.code = code


def request_fields(params: Any) -> dict:
    """Chat-completion fields from SamplingParams, a mapping, or None (server defaults)."""
    if params is None:
        return {}
    source = params if isinstance(params, Mapping) else {n: getattr(params, n) for n in _PARAM_FIELDS if hasattr(params, n)}
    out = {}
    for name, value in source.items():
        if name in _NEUTRAL and value == _NEUTRAL[name]:
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


class _Endpoint:
    def __init__(self, url: str, api_key: str | None, timeout: float):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerConnectionError(f"--server {url!r}: expected a URL like http://127.0.0.1:18000/v1")
        self.url = url
        self.scheme, self.netloc = parts.scheme, parts.netloc
        path = parts.path.rstrip("/")
        self.prefix = path if path.endswith("/v1") else path + "/v1"
        self.headers = {"Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def open(self, method: str, path: str, body: dict | None = None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.netloc, timeout=self.timeout)
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, self.prefix + path, body=data, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise ServerConnectionError(f"cannot reach the server at {self.url}: {exc}") from exc
        if response.status >= 400:
            error = _error_from(response, self.url)
            conn.close()
            raise error
        return conn, response

    def first_model(self) -> str:
        conn, response = self.open("GET", "/models")
        try:
            models = json.loads(response.read()).get("data") or []
            ids = [m["id"] for m in models]
        except (ValueError, AttributeError, KeyError, TypeError) as exc:
            raise ServerRequestError(f"{self.url}/models: not an OpenAI model list", status=response.status,
                                     code=None) from exc
        finally:
            conn.close()
        if not ids:
            raise ServerRequestError(f"{self.url}: the server lists no models", status=200, code=None)
        return ids[0]


def _error_from(response: http.client.HTTPResponse, url: str) -> ServerRequestError:
    raw = response.read()
    try:
        error = json.loads(raw)["error"]
        message, code = error.get("message"), error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, code = raw[:200].decode("utf-8", "replace").strip() or response.reason, None
    suffix = f" ({code})" if code else ""
    return ServerRequestError(f"{url} answered {response.status}{suffix}: {message}", status=response.status, code=code)


def ask_server(url: str, messages: list[dict], params: Any = None, api_key: str | None = None, *,
               model: str | None = None, timeout: float = 600.0) -> Iterator[str]:
    """Stream the assistant's answer to ``messages`` from an OpenAI-compatible server.

    ``params`` is a SamplingParams (or a dict of the same fields); ``api_key`` defaults to
    $QWEN_TRAY_API_KEY; ``model`` defaults to the first model the server lists.
    """
    endpoint = _Endpoint(url, api_key if api_key is not None else os.environ.get(API_KEY_ENV), timeout)
    body = {"model": model or endpoint.first_model(), "messages": messages, "stream": True,
            **request_fields(params)}
    conn, response = endpoint.open("POST", "/chat/completions", body)
    try:
        for data in iter_event_data(_lines(response)):
            if data == DONE:
                return
            try:
                event = json.loads(data)
            except ValueError as exc:
                raise ServerRequestError(f"{url}: the stream sent invalid JSON: {data[:80]!r}", status=200,
                                         code=None) from exc
            if "error" in event:
                err = event["error"] or {}
                raise ServerRequestError(f"{url}: {err.get('message')}", status=200, code=err.get("code"))
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    yield content
    except OSError as exc:
        raise ServerConnectionError(f"connection to {url} broke mid-answer: {exc}") from exc
    finally:
        conn.close()


def _lines(response: http.client.HTTPResponse) -> Iterator[bytes]:
    while True:
        line = response.readline()
        if not line:
            return
        yield line
