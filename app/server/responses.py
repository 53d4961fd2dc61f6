"""The two response shapes the API sends besides plain JSON: OpenAI errors and event streams."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.server.errors import SERVER_ERROR, ApiError

log = logging.getLogger("app.server")


def error_response(error: ApiError, request_line: str = "") -> Response:
    """OpenAI's error body with the error's status and headers.

    ``Connection: close`` when the request body was left unread: its bytes would otherwise
    be parsed as the next request on this connection.
    """
    if error.type == SERVER_ERROR or error.status == 429:  # the server's trouble, not a client's mistake
        log.warning("%s -> %d %s", request_line or "request", error.status, error.message)
    headers = dict(error.headers)
    if error.close_connection:
        headers["Connection"] = "close"
    return Response(error.body_bytes(), status_code=error.status, headers=headers, media_type="application/json")


class EventStreamResponse(StreamingResponse):
    """Server-sent events as OpenAI streams them (``data: {...}`` ... ``data: [DONE]``).

    The body ends when ``events`` does; ``on_close`` runs before its last (empty) frame, so the
    request is done for the server when the client sees the end. Unlike Starlette's
    StreamingResponse this does not listen for the client leaving itself: the request's own
    disconnect watch (generation.GenerationRun) cancels the generation, which ends ``events``;
    uvicorn drops whatever is sent after the client left.
    """

    def __init__(self, events: AsyncGenerator[bytes, None], on_close: Callable[[], Awaitable[None]]):
        super().__init__(events, status_code=200, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self._events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:  # also when cancelled mid-stream (forced shutdown) or never started
            await self._events.aclose()
            await self._on_close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
