"""Serving one generation over HTTP: start it, stream or collect it, answer, clean up.

The engine's ``Generation`` is a blocking iterator; each request already has its own
handler thread, so the thread simply iterates it. Whatever happens (client gone, engine
error, server stopping) the generation is cancelled on the way out so its slot is freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.engine.params import SamplingParams
from app.engine.request import PRIORITY_BACKGROUND
from app.server.errors import ClientGone, from_exception, invalid_param, unavailable
from app.server.protocol import ApiRequest, ResponseBuilder
from app.server.sse import DONE
from app.server.watcher import ActiveRequest

# Longer than any single engine step, even a 7B prefill chunk on a laptop GPU.
SETTLE_TIMEOUT_S = 30.0

if TYPE_CHECKING:
    from app.server.handler import ApiHandler, EventStreamWriter


def serve_request(handler: ApiHandler, request: ApiRequest, engine: Any, model_id: str) -> None:
    server = handler.server
    with server.admission(engine):
        generation = start_generation(engine, request)
        active = ActiveRequest(generation)
        server.begin(active, handler.connection)
        try:
            builder = ResponseBuilder(request.kind, model_id, request.include_usage)
            if request.stream:
                _stream(handler, active, builder)
            else:
                _respond_whole(handler, active, builder)
        finally:
            generation.cancel()  # no-op when finished; frees the slot on every early exit
            _settle(generation)
            server.end(active, handler.connection)


def _settle(generation: Any) -> None:
    """Wait (one engine step at most) until a cancelled generation has left its slot, so
    the request is only "done" for the server once the engine has really freed it."""
    try:
        generation.wait(timeout=SETTLE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - an engine error was already answered to the client
        pass


def start_generation(engine: Any, request: ApiRequest):
    """Queue the request in the engine (raises ContextLengthError/InvalidParameterError first)."""
    sampling = dict(request.sampling)
    if request.kind == "chat":
        prompt_ids = engine.tokenizer.encode_chat(request.messages)
    elif isinstance(request.prompt, str):
        prompt_ids = engine.tokenizer.encode(request.prompt)
    else:
        prompt_ids = _checked_token_ids(request.prompt, engine.spec.vocab_size)
    # Chat without max_tokens means "until the context is full", as with OpenAI.
    sampling.setdefault("max_tokens", max(1, engine.max_context - len(prompt_ids)))
    params = SamplingParams(**sampling)
    return engine.generate(prompt_ids, params, priority=PRIORITY_BACKGROUND)


def _checked_token_ids(ids: list[int], vocab_size: int) -> list[int]:
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise invalid_param("prompt", f"prompt[{i}]: token id {token} is outside the vocabulary (0..{vocab_size - 1})")
    return ids


def _finish_reason(active: ActiveRequest) -> str | None:
    """The OpenAI finish_reason, or None when the generation was cancelled.

    "cancelled" never reaches a client that is still connected as a finish reason: a
    client that left gets nothing, one whose request was cut by shutdown gets an error.
    """
    reason = active.generation.result.finish_reason
    return None if reason == "cancelled" else reason


def _shutdown_error(retry_after_s: int):
    return unavailable("The request was cancelled because the server is shutting down.",
                       "server_shutting_down", retry_after_s)


def _respond_whole(handler: ApiHandler, active: ActiveRequest, builder: ResponseBuilder) -> None:
    for _ in active.generation:  # engine errors raise here, before anything is sent
        pass
    result = active.generation.result
    reason = _finish_reason(active)
    if reason is None:
        if active.client_gone:
            handler.close_connection = True
            return
        raise _shutdown_error(handler.server.config.retry_after_s)
    usage = result.usage
    handler.send_json(200, builder.full(result.text, reason, usage.prompt_tokens, usage.completion_tokens))


def _stream(handler: ApiHandler, active: ActiveRequest, builder: ResponseBuilder) -> None:
    deltas = iter(active.generation)
    # Wait for the first piece before sending headers: an error or a cancel while queued
    # still gets a proper HTTP status instead of a broken stream.
    first = next(deltas, None)
    if first is None and _finish_reason(active) is None:
        if active.client_gone:
            handler.close_connection = True
            return
        raise _shutdown_error(handler.server.config.retry_after_s)
    writer = handler.start_event_stream()
    try:
        opening = [builder.chunk(first=True)] + ([builder.chunk(first)] if first else [])
        writer.send(*opening)
        for delta in deltas:
            writer.send(builder.chunk(delta))
        _end_stream(handler, active, builder, writer)
    except ClientGone:
        active.on_client_gone()
        handler.close_connection = True
    except Exception as exc:  # engine failure mid-stream: OpenAI sends an error event
        error = from_exception(exc, prompt_param="messages", retry_after_s=handler.server.config.retry_after_s)
        handler.close_connection = True
        try:
            writer.send(error.body())
            writer.close()
        except ClientGone:
            pass


def _end_stream(handler: ApiHandler, active: ActiveRequest, builder: ResponseBuilder,
                writer: EventStreamWriter) -> None:
    reason = _finish_reason(active)
    if reason is None:
        if not active.client_gone:
            writer.send(_shutdown_error(handler.server.config.retry_after_s).body())
            writer.close()
        handler.close_connection = True
        return
    usage = active.generation.result.usage
    events: list = [builder.chunk(finish_reason=reason)]
    if builder.include_usage:
        events.append(builder.usage_chunk(usage.prompt_tokens, usage.completion_tokens))
    events.append(DONE)
    writer.send(*events)
    writer.close()
