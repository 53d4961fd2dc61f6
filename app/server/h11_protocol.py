"""uvicorn's h11 connection protocol with two additions: a request-head deadline and JSON 400s.

- uvicorn only times out a connection that is idle *after* a response (``timeout_keep_alive``),
  and any received byte resets that timer. A client that connects and sends nothing, or trickles
  a request head one byte at a time (slowloris), would hold its socket forever. Here the head
  (request line and headers) must be complete within ``head_timeout_s`` of the connection
  opening or of the previous response; otherwise the connection is closed. The body has its own
  deadline in routes.read_body, so a streaming answer, however long, is never cut.
- A request h11 cannot parse (a malformed request line, a missing Host on HTTP/1.1, a head over
  the size limit, a malformed chunked body) gets OpenAI's error body as JSON instead of uvicorn's
  plain-text 400, with the status h11 suggests (431 for a head that is too large); a route already
  running for that request's head sends nothing after it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from http import HTTPStatus

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.server.errors import ApiError

log = logging.getLogger("app.server")
# h11 quotes the offending bytes as a Python repr ("illegal request line: bytearray(b'...')").
_BYTES_REPR = re.compile(r"[:\s]*(?:bytearray\(|b['\"]).*$", re.DOTALL)


def _without_repr(detail: str) -> str:
    """h11's reason without the bytes it quotes: "illegal request line"."""
    return _BYTES_REPR.sub("", detail)


class _Connection(h11.Connection):
    """h11's connection, remembering the last protocol error so the answer can name it."""

    last_error: h11.RemoteProtocolError | None = None

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.last_error = exc
            raise


class DeadlineH11Protocol(H11Protocol):
    head_timeout_s: float = 30.0  # set per server by protocol_class()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.conn = _Connection(h11.SERVER, self.config.h11_max_incomplete_event_size)  # set by server.py
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # a whole head arrived (or the request failed)
            self._disarm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_deadline()  # the next request on this keep-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        error = self.conn.last_error
        status = error.error_status_hint if error is not None and 400 <= error.error_status_hint < 500 else 400
        detail = _without_repr(str(error) if error is not None else msg)
        code = "missing_host" if "Host" in detail else ("request_header_too_large" if status == 431
                                                         else "invalid_http_request")
        body = ApiError(status, f"Invalid HTTP request: {detail[:200]}.", code=code).body_bytes()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        head = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode())
        try:
            for event in (head, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response was already under way: just close
            pass
        self.transport.close()
        self._end_cycle()

    def _end_cycle(self) -> None:
        """The request being read when h11 gave up (a malformed chunked body) has a route running
        for its head: it is told the client is gone, as uvicorn tells it when the socket closes,
        so it sends nothing more on a connection h11 has closed (that was a LocalProtocolError
        and "Exception in ASGI application" with a traceback in the log)."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            log.debug("%s: the request body could not be parsed; its route's answer is dropped",
                      cycle.scope.get("path", "?"))
            cycle.disconnected = True
            cycle.message_event.set()

    # -- the head deadline ------------------------------------------------------------------------
    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_deadline_passed)

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_deadline_passed(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.debug("closing a connection that sent no complete request head in %g s", self.head_timeout_s)
            self.transport.close()


def protocol_class(head_timeout_s: float) -> type[DeadlineH11Protocol]:
    """The protocol class uvicorn instantiates per connection, with this server's deadline."""
    return type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"head_timeout_s": head_timeout_s})
