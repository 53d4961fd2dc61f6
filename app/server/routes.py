"""The OpenAI-compatible API as an ASGI application (Starlette): routes, request bodies, errors.

Every route runs inside :func:`_endpoint`, which turns any exception into OpenAI's error
body (a bug is a logged 500 without a traceback in the answer), so nothing reaches
Starlette's or uvicorn's own plain-text error pages. Blocking work (JSON parsing of a large
body, tokenizing, the engine) runs off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from app.server import protocol, shapes
from app.server.errors import ApiError, from_exception, model_not_found
from app.server.fields import quoted
from app.server.generation import serve_generation
from app.server.guard import GuardMiddleware, unknown_path_message
from app.server.responses import error_response
from app.server.service import ApiService

Handler = Callable[[Request], Awaitable[Response]]
# OpenAI's other APIs under /v1 (platform.openai.com/docs/api-reference): a client that calls one
# learns that this server does not have it, not merely that the path is unknown.
OPENAI_ENDPOINTS = frozenset({"embeddings", "responses", "conversations", "images", "audio", "moderations",
                              "files", "uploads", "batches", "fine_tuning", "assistants", "threads",
                              "vector_stores", "realtime", "evals", "containers", "videos"})


def create_app(service: ApiService) -> ASGIApp:
    api = _Routes(service)
    routes = [
        Route("/health", api.endpoint(api.health), methods=["GET"]),
        Route("/v1/models", api.endpoint(api.list_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.endpoint(api.retrieve_model), methods=["GET"]),
        Route("/v1/chat/completions", api.endpoint(partial(api.generate, "chat"), "messages"), methods=["POST"]),
        Route("/v1/completions", api.endpoint(partial(api.generate, "completion"), "prompt"), methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_exception})
    app.router.redirect_slashes = False  # GuardMiddleware strips trailing slashes instead
    return GuardMiddleware(app, service.config)


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's routing answers (no such path, wrong method) in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        error = ApiError(405, f"Method {request.method} is not allowed here; use {_methods_to_use(allowed)}.",
                         code="method_not_allowed", headers={"Allow": f"{allowed}, OPTIONS"})
    elif exc.status_code == 404:
        error = ApiError(404, _unknown_path_message(path), code="not_found")
    else:
        error = ApiError(exc.status_code, str(exc.detail), code="invalid_request")
    return error_response(error, f"{request.method} {path}")


def _methods_to_use(allow: str) -> str:
    """The methods a client means, from Starlette's ``Allow`` ("HEAD, GET" -> "GET"): HEAD comes
    with every GET route and is named only where it is all there is."""
    methods = [m.strip() for m in allow.split(",") if m.strip()]
    return " or ".join([m for m in methods if m != "HEAD"] or methods)


def _unknown_path_message(path: str) -> str:
    """A path of OpenAI's API this server does not implement says so, and what it serves instead."""
    endpoint = path.removeprefix("/v1/").split("/", 1)[0]
    if not path.startswith("/v1/") or endpoint not in OPENAI_ENDPOINTS:
        return unknown_path_message(path)
    return (f"This server does not support OpenAI's /v1/{endpoint} API; it serves /v1/chat/completions, "
            f"/v1/completions and /v1/models.")


class _Routes:
    def __init__(self, service: ApiService):
        self.service = service

    def endpoint(self, handler: Handler, prompt_param: str = "messages") -> Handler:
        retry_after_s = self.service.config.retry_after_s

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except ClientDisconnect:  # left while sending its body: nobody reads an answer
                return Response(status_code=400)
            except Exception as exc:  # noqa: BLE001 - every failure is an OpenAI error body
                error = from_exception(exc, prompt_param=prompt_param, retry_after_s=retry_after_s)
                return error_response(error, f"{request.method} {request.url.path}")

        return run

    async def health(self, request: Request) -> Response:
        status, body = self.service.health()
        return JSONResponse(body, status_code=status)

    async def list_models(self, request: Request) -> Response:
        _, model_id = self.service.ready_engine()
        return JSONResponse(shapes.models_list(model_id, self.service.created))

    async def retrieve_model(self, request: Request) -> Response:
        engine, model_id = self.service.ready_engine()
        wanted = request.path_params["model_id"]
        if not self.service.serves(engine, model_id, wanted):
            raise model_not_found(wanted)
        return JSONResponse(shapes.model_card(model_id, self.service.created))

    async def generate(self, kind: protocol.Kind, request: Request) -> Response:
        raw = await read_body(request, self.service.config.max_body_bytes, self.service.config.request_timeout_s)
        loop = asyncio.get_running_loop()
        api_request = await loop.run_in_executor(None, protocol.parse_request, raw, kind)
        engine, model_id = self.service.ready_engine()
        if not self.service.serves(engine, model_id, api_request.model):
            raise model_not_found(api_request.model)
        return await serve_generation(self.service, api_request, engine, model_id, request.receive)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, at most ``limit`` bytes, arriving within ``timeout_s``; else 4xx.

    A chunked body (``Transfer-Encoding: chunked``: .NET's JsonContent, Java's and Go's streamed
    bodies; HTTP/1.1 servers must take it) is de-chunked by h11 and counted as it arrives: 413 as
    soon as it passes the limit, without reading the rest. A Content-Length over the limit is a
    413 before any of the body is read.
    """
    headers = request.headers
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()  # h11 then ignores Content-Length
    if not chunked:
        _check_content_length(headers.get("content-length"), limit)
    try:
        return await asyncio.wait_for(_receive_all(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"The request body did not arrive within {timeout_s:g} s.", code="request_timeout",
                       close_connection=True) from None


def _check_content_length(raw_length: str | None, limit: int) -> None:
    if raw_length is None:
        raise ApiError(411, "A Content-Length header or a chunked body is required.", code="length_required",
                       close_connection=True)
    length = int(raw_length) if raw_length.strip().isdigit() else -1  # h11 already refused other forms
    if length < 0:
        raise ApiError(400, f"Invalid Content-Length header: {quoted(raw_length)}.", code="invalid_request",
                       close_connection=True)
    if length > limit:
        raise _too_large(f"Request body is {length} bytes; the limit is {limit} bytes.")


async def _receive_all(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # the rest stays unread: the connection is closed after the answer
            raise _too_large(f"Request body is over the limit of {limit} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(message: str) -> ApiError:
    return ApiError(413, message, code="request_too_large", close_connection=True)
