"""The checks every request passes before any route runs (an ASGI middleware).

In order: a method and HTTP version we speak (501 / 505), the Host header (DNS rebinding),
the Origin (cross-site pages), CORS preflight answers, the /v1 prefix (404) and the API key
on /v1 (401). security.py decides; this module only applies its rules to ASGI messages and
adds the CORS headers of an allowed origin to every response, errors and streams included.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.server.config import ServerConfig
from app.server.errors import ApiError
from app.server.responses import error_response
from app.server.security import check_api_key, check_host, check_origin, cors_headers, preflight_headers

KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
SERVED_PATHS = "/v1/chat/completions, /v1/completions, /v1/models and /health"
HTTP_VERSIONS = ("1.0", "1.1")


class GuardMiddleware:
    def __init__(self, app: ASGIApp, config: ServerConfig):
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"  # "/v1/models/" is "/v1/models", as before
        scope = {**scope, "path": path}
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        cors: dict[str, str] = {}
        try:
            _check_protocol(scope)
            check_host(headers.get("host"), self.config)
            check_origin(origin, self.config)
            cors = cors_headers(origin, self.config)
            if scope["method"] == "OPTIONS":
                response = Response(status_code=204, headers=preflight_headers(origin, headers, self.config))
                await response(scope, receive, send)
                return
            if path != "/health":
                if not path.startswith("/v1/"):
                    raise ApiError(404, unknown_path_message(path), code="not_found")
                check_api_key(headers.get("authorization"), self.config)
        except ApiError as error:
            response = error_response(_closing(error, headers), f"{scope['method']} {path}")
            await response(scope, receive, _with_headers(send, cors))
            return
        await self.app(scope, receive, _with_headers(send, cors))


def unknown_path_message(path: str) -> str:
    """The 404 of a path nothing serves ("/v1" included: the API is under it, not at it)."""
    return f"Unknown path {path}; this server serves {SERVED_PATHS}."


def _check_protocol(scope: Scope) -> None:
    method, version = scope["method"], scope["http_version"]
    if version not in HTTP_VERSIONS:  # h11 parses "GET / HTTP/2.0" as HTTP/1 with another number
        raise ApiError(505, f"HTTP/{version} is not supported; this server speaks HTTP/1.1 (and 1.0).",
                       code="http_version_not_supported", close_connection=True)
    if method not in KNOWN_METHODS:
        raise ApiError(501, f"Method {method} is not implemented.", code="not_implemented")


def _closing(error: ApiError, headers: Headers) -> ApiError:
    """Refused before its body was read: a request with a body cannot leave the connection reusable."""
    has_body = headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers
    if has_body and not error.close_connection:
        error.close_connection = True
    return error


def _with_headers(send: Send, extra: dict[str, str]) -> Send:
    if not extra:
        return send
    raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra.items()]

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *raw]}
        await send(message)

    return send_with_headers
