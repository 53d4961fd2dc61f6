"""The HTTP request handler: security checks, routing, JSON in and out.

One handler instance serves one connection (keep-alive) on its own thread. Generating is
delegated to :mod:`app.server.generation`; this module only speaks HTTP.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from app.server import protocol
from app.server.errors import ApiError, ClientGone, from_exception, model_not_found, unavailable
from app.server.security import check_api_key, check_host, check_origin, cors_headers, preflight_headers
from app.server.sse import LAST_CHUNK, encode_chunk, encode_event

if TYPE_CHECKING:
    from app.server.server import ApiServer

log = logging.getLogger("app.server")
access_log = logging.getLogger("app.server.access")

# Errors of a peer that went away: nothing to answer, just drop the connection.
CONNECTION_ERRORS = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class EventStreamWriter:
    """Writes SSE events, chunk-encoded on HTTP/1.1 so the connection can be reused."""

    def __init__(self, wfile, chunked: bool):
        self._wfile = wfile
        self._chunked = chunked

    def send(self, *events: dict | str) -> None:
        data = b"".join(encode_event(e) for e in events)
        self._write(encode_chunk(data) if self._chunked else data)

    def close(self) -> None:
        if self._chunked:
            self._write(LAST_CHUNK)

    def _write(self, data: bytes) -> None:
        try:
            self._wfile.write(data)  # unbuffered socket writer: sendall
        except OSError as exc:
            raise ClientGone() from exc


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "QwenTray"
    server: ApiServer

    def setup(self) -> None:
        self.timeout = self.server.config.socket_timeout_s  # applied by StreamRequestHandler.setup
        super().setup()
        self._cors: dict[str, str] = {}
        self._body_pending = False
        self.server.track_connection(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:  # flushing to a client that already left
            pass
        finally:
            self.server.untrack_connection(self.connection)

    # -- methods ------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_OPTIONS(self) -> None:
        self._dispatch()

    do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    def _dispatch(self) -> None:
        length = self.headers.get("Content-Length", "0").strip()
        self._body_pending = length not in ("", "0") or "Transfer-Encoding" in self.headers
        origin = self.headers.get("Origin")
        self._cors = {}
        try:
            check_host(self.headers.get("Host"), self.server.config)
            check_origin(origin, self.server.config)
            self._cors = cors_headers(origin, self.server.config)
            self._route(urlsplit(self.path).path, origin)
        except ClientGone:
            self.close_connection = True
        except CONNECTION_ERRORS:
            self.close_connection = True
        except Exception as exc:  # every failure becomes an OpenAI error body, never a traceback
            self.send_api_error(from_exception(exc, prompt_param="messages",
                                               retry_after_s=self.server.config.retry_after_s))

    def _route(self, path: str, origin: str | None) -> None:
        path = path.rstrip("/") or "/"
        if self.command == "OPTIONS":
            self._send(204, b"", preflight_headers(origin, self.headers, self.server.config))
            return
        if path == "/health":
            self._require("GET")
            self.send_json(*self.server.health())
            return
        if not path.startswith("/v1/"):
            raise ApiError(404, f"Unknown path {path}; the API is under /v1.", code="not_found")
        check_api_key(self.headers.get("Authorization"), self.server.config)
        if path == "/v1/models":
            self._require("GET")
            engine, model_id = self.server.ready_engine()
            self.send_json(200, protocol.models_list(model_id, self.server.created))
        elif path.startswith("/v1/models/"):
            self._require("GET")
            engine, model_id = self.server.ready_engine()
            wanted = unquote(path[len("/v1/models/"):])
            if wanted != model_id:
                raise model_not_found(wanted)
            self.send_json(200, protocol.model_card(model_id, self.server.created))
        elif path in ("/v1/chat/completions", "/v1/completions"):
            self._require("POST")
            self._generate(path)
        else:
            raise ApiError(404, f"Unknown path {path}.", code="not_found")

    def _generate(self, path: str) -> None:
        from app.server.generation import serve_request  # imports the engine's params (lazy)

        body = self._read_json()
        parse = protocol.parse_chat_request if path.endswith("chat/completions") else protocol.parse_completion_request
        request = parse(body)
        engine, model_id = self.server.ready_engine()
        if request.model != model_id:
            raise model_not_found(request.model)
        try:
            serve_request(self, request, engine, model_id)
        except (ApiError, ClientGone) + CONNECTION_ERRORS:
            raise
        except Exception as exc:
            raise from_exception(exc, prompt_param=request.prompt_param,
                                 retry_after_s=self.server.config.retry_after_s) from exc

    def _require(self, method: str) -> None:
        if self.command != method:
            raise ApiError(405, f"Method {self.command} is not allowed here; use {method}.",
                           code="method_not_allowed", headers={"Allow": f"{method}, OPTIONS"})

    # -- body ---------------------------------------------------------------------------------
    def _read_json(self) -> dict:
        limit = self.server.config.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise ApiError(411, "Chunked request bodies are not supported; send Content-Length.",
                           code="length_required", close_connection=True)
        raw_length = self.headers.get("Content-Length")
        if raw_length is None:
            raise ApiError(411, "A Content-Length header is required.", code="length_required",
                           close_connection=True)
        try:
            length = int(raw_length)
        except ValueError:
            length = -1
        if length < 0:
            raise ApiError(400, f"Invalid Content-Length {raw_length!r}.", code="invalid_request",
                           close_connection=True)
        if length > limit:
            raise ApiError(413, f"Request body is {length} bytes; the limit is {limit} bytes.",
                           code="request_too_large", close_connection=True)
        raw = self.rfile.read(length)
        if len(raw) < length:
            raise ClientGone()
        self._body_pending = False
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ApiError(400, f"Request body is not valid JSON: {exc}.", code="invalid_json") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "Request body must be a JSON object.", code="invalid_json")
        return body

    # -- responses ----------------------------------------------------------------------------
    def send_json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        self._send(status, data, {"Content-Type": "application/json", **(headers or {})})

    def send_api_error(self, error: ApiError) -> None:
        if error.status >= 500 or error.status == 429:
            log.warning("%s %s -> %d %s", self.command, getattr(self, "path", "?"), error.status, error.message)
        if error.close_connection or self._body_pending:
            self.close_connection = True  # unread body bytes would be parsed as the next request
        try:
            self.send_json(error.status, error.body(), error.headers)
        except OSError:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own protocol errors (bad request line, 414, 431, 501) as OpenAI bodies."""
        self._cors = getattr(self, "_cors", {})
        self._body_pending = True
        text = message or HTTPStatus(code).phrase
        self.send_api_error(ApiError(code, f"{text}.", code=HTTPStatus(code).name.lower(), close_connection=True))

    def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {**self._cors, **headers}.items():
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Length", str(len(data)))
        if self.close_connection or self.server.stopping:
            self.close_connection = True
            self.send_header("Connection", "close")
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def start_event_stream(self) -> EventStreamWriter:
        chunked = self.request_version == "HTTP/1.1"
        self.send_response(200)
        headers = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
                   "X-Accel-Buffering": "no", **self._cors}
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        else:
            self.close_connection = True  # HTTP/1.0: the end of the body is the end of the connection
            headers["Connection"] = "close"
        for name, value in headers.items():
            self.send_header(name, value)
        try:
            self.end_headers()
        except OSError as exc:
            raise ClientGone() from exc
        return EventStreamWriter(self.wfile, chunked)

    def version_string(self) -> str:
        return self.server_version  # no Python version in the Server header

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        access_log.info("%s %s", self.address_string(), format % args)


def loading_error(state: str, error: str | None, retry_after_s: int) -> ApiError:
    if state == "error":
        return unavailable(f"The model failed to load: {error}", "model_load_failed", retry_after_s)
    return unavailable("The model is still loading; retry shortly.", "model_loading", retry_after_s)
