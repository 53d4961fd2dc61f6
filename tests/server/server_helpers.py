"""Helpers for the server tests (imported by name: pytest's default "prepend" import mode puts the folder
of a test module that has no __init__.py, tests/server, first on the import path)."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def error(self) -> dict:
        return self.json()["error"]


def raw_request(handle, method: str, path: str, body: object = None, headers: dict | None = None,
                raw_body: bytes | None = None, skip_host: bool = False) -> RawResponse:
    """One HTTP request with full control over headers and body (http.client, no retries)."""
    conn = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
    try:
        data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
        conn.putrequest(method, path, skip_host=skip_host or "Host" in (headers or {}), skip_accept_encoding=True)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if data is not None and "Content-Length" not in all_headers:
            all_headers["Content-Length"] = str(len(data))
        for name, value in all_headers.items():
            if value is not None:  # None: leave the header out
                conn.putheader(name, value)
        conn.endheaders(data)
        response = conn.getresponse()
        return RawResponse(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def wait_until(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll until ``condition()``; the timeout only guards against a hang, it is not a speed test."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def chat_body(model: str, content: str = "Hello", **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}
