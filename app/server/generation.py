"""Serving one generation: start it, stream or collect it, answer, clean up.

The engine's ``Generation`` is a blocking iterator fed by the scheduler thread. The event loop
must never block on it, so a small thread per running request (a :class:`DeltaPump`) iterates
it and hands each delta to the loop. Threads are bounded by admission (``max_batch_size +
max_queued``). Whatever happens (client gone, engine error, server stopping) the generation
is cancelled on the way out and the request only counts as done once the engine has let go
of it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from app.engine.params import SamplingParams
from app.engine.request import PRIORITY_BACKGROUND
from app.server.errors import ApiError, context_length_exceeded, from_exception, max_tokens_too_large, unavailable
from app.server.fields import invalid_value
from app.server.protocol import ApiRequest
from app.server.responses import EventStreamResponse
from app.server.service import ActiveRequest, ApiService
from app.server.shapes import ResponseBuilder
from app.server.sse import DONE, encode_event

# Longer than any single engine step, even a 7B prefill chunk on a laptop GPU.
SETTLE_TIMEOUT_S = 30.0
_END = object()  # the pump's last item when the generation ended without an error


class DeltaPump:
    """Iterates a Generation on its own thread; :meth:`next` awaits its deltas on the loop."""

    def __init__(self, generation: Any, loop: asyncio.AbstractEventLoop):
        self._generation = generation
        self._loop = loop
        self._items: asyncio.Queue = asyncio.Queue()
        self._ended = asyncio.Event()  # the engine is done with the generation
        threading.Thread(target=self._run, name=f"qwen-tray-request-{generation.request_id}", daemon=True).start()

    def _run(self) -> None:
        end: object = _END
        try:
            for delta in self._generation:
                self._post(delta)
        except BaseException as exc:  # noqa: BLE001 - the engine's error goes to the request's task
            end = exc
        self._post(end)
        self._post(None)

    def _post(self, item: object) -> None:
        try:
            if item is None:
                self._loop.call_soon_threadsafe(self._ended.set)
            else:
                self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server stopped and nobody waits any more
            pass

    async def next(self) -> str | None:
        """The next delta, or None at the end; raises the engine's error."""
        item = await self._items.get()
        if item is _END:
            self._items.put_nowait(_END)  # the end stays the end for later calls
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    async def settled(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except asyncio.TimeoutError:
            pass


class GenerationRun:
    """One admitted request's generation, its pump and its disconnect watch; :meth:`finish` once."""

    def __init__(self, service: ApiService, generation: Any, receive: Receive):
        self.service = service
        self._finished = False
        self.active = ActiveRequest(generation)
        self.pump = DeltaPump(generation, asyncio.get_running_loop())
        service.begin(self.active)
        self._watch = asyncio.ensure_future(_watch_disconnect(receive, self.active))

    @property
    def generation(self) -> Any:
        return self.active.generation

    def finish_reason(self) -> str | None:
        """The OpenAI finish_reason, or None when the generation was cancelled.

        "cancelled" never reaches a client that is still connected as a finish reason: a
        client that left gets nothing, one whose request was cut by shutdown gets an error.
        """
        reason = self.generation.result.finish_reason  # the pump has seen the end: no wait
        return None if reason == "cancelled" else reason

    async def finish(self) -> None:
        """Cancel (a no-op when it ended), wait until the engine let go, count the request out."""
        if self._finished:
            return
        self._finished = True
        self._watch.cancel()
        self.generation.cancel()  # no-op when finished; frees the slot on every early exit
        await self.pump.settled(SETTLE_TIMEOUT_S)
        self.service.end(self.active)
        self.service.release()


async def _watch_disconnect(receive: Receive, active: ActiveRequest) -> None:
    """The body is read: the next ASGI message is the client leaving (uvicorn sees the EOF)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    active.on_client_gone()


async def serve_generation(service: ApiService, request: ApiRequest, engine: Any, model_id: str,
                           receive: Receive) -> Response:
    service.admit(engine)  # 429 when full
    try:
        generation = await _start_off_loop(engine, request)
    except BaseException:
        service.release()
        raise
    run = GenerationRun(service, generation, receive)
    builder = ResponseBuilder(request.kind, model_id, request.include_usage)
    retry_after_s = service.config.retry_after_s
    if not request.stream:
        try:
            return await _whole(run, builder, retry_after_s)
        finally:
            await run.finish()
    try:
        # Wait for the first piece before sending headers: an error or a cancel while queued
        # still gets a proper HTTP status instead of a broken stream.
        first = await run.pump.next()
        cancelled = first is None and run.finish_reason() is None
    except BaseException:
        await run.finish()
        raise
    if cancelled:
        await run.finish()
        if run.active.client_gone:
            return Response(status_code=204)  # nobody reads it
        raise _shutdown_error(retry_after_s)
    return EventStreamResponse(_events(run, builder, first, request.prompt_param, retry_after_s), run.finish)


async def _start_off_loop(engine: Any, request: ApiRequest) -> Any:
    """Tokenize and queue the request on a worker thread: a long prompt takes a while."""
    future = asyncio.get_running_loop().run_in_executor(None, start_generation, engine, request)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:  # the server is being torn down: stop the generation when it exists
        future.add_done_callback(_cancel_started)
        raise


def _cancel_started(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()


def start_generation(engine: Any, request: ApiRequest):
    """Queue the request in the engine; 400 first when it cannot fit the context window.

    The window (``engine.max_context``, what /health reports) holds prompt + answer. A
    ``max_tokens`` the window could never hold is refused naming the field, as OpenAI does; a
    prompt must leave room for one token. Within that, the answer stops where the window
    ends (finish_reason "length"): clients that always send the same ``max_tokens``
    (``qwen-tray ask --server`` sends 512) keep working with long prompts.
    """
    window = engine.max_context
    sampling = dict(request.sampling)
    asked = sampling.get("max_tokens")
    if asked is not None and asked >= window:
        raise max_tokens_too_large(request.max_tokens_param, asked, window - 1)
    if request.kind == "chat":
        prompt_ids = engine.tokenizer.encode_chat(request.messages)
    elif isinstance(request.prompt, str):
        prompt_ids = engine.tokenizer.encode(request.prompt)
    else:
        prompt_ids = _checked_token_ids(request.prompt, engine.spec.vocab_size, request.prompt_where)
    room = window - len(prompt_ids)
    if room < 1:
        raise context_length_exceeded(window, len(prompt_ids), request.prompt_param)
    wanted = asked if asked is not None else request.default_max_tokens or room
    sampling["max_tokens"] = min(room, wanted)  # below 1 stays so: SamplingParams names the field
    params = SamplingParams(**sampling)
    return engine.generate(prompt_ids, params, priority=PRIORITY_BACKGROUND)


def _checked_token_ids(ids: list[int], vocab_size: int, where: str) -> list[int]:
    """Every id names a token of the model; else a 400 naming the element (``prompt[3]``)."""
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            shown = str(token) if abs(token) < 10**20 else f"{str(token)[:20]}..."
            raise invalid_value(f"{where}[{i}]", f"token id {shown} is not in the model's vocabulary "
                                                 f"(0 to {vocab_size - 1})")
    return ids


def _shutdown_error(retry_after_s: int) -> ApiError:
    return unavailable("The request was cancelled because the server is shutting down.",
                       "server_shutting_down", retry_after_s)


async def _whole(run: GenerationRun, builder: ResponseBuilder, retry_after_s: int) -> Response:
    while await run.pump.next() is not None:  # engine errors raise here, before anything is sent
        pass
    reason = run.finish_reason()
    if reason is None:
        if run.active.client_gone:
            return Response(status_code=204)  # nobody reads it
        raise _shutdown_error(retry_after_s)
    result = run.generation.result
    usage = result.usage
    return JSONResponse(builder.full(result.text, reason, usage.prompt_tokens, usage.completion_tokens))


async def _events(run: GenerationRun, builder: ResponseBuilder, first: str | None, prompt_param: str,
                  retry_after_s: int) -> AsyncGenerator[bytes, None]:
    try:
        opening = builder.opening(first)
        if opening:
            yield b"".join(encode_event(e) for e in opening)
        while (delta := await run.pump.next()) is not None:
            yield encode_event(builder.chunk(delta))
        reason = run.finish_reason()
        if reason is not None:
            usage = run.generation.result.usage
            events: list = [builder.chunk(finish_reason=reason)]
            if builder.include_usage:
                events.append(builder.usage_chunk(usage.prompt_tokens, usage.completion_tokens))
            yield b"".join(encode_event(e) for e in [*events, DONE])
        elif not run.active.client_gone:  # cut by shutdown: OpenAI's error event, no [DONE]
            yield encode_event(_shutdown_error(retry_after_s).body())
    except Exception as exc:  # engine failure mid-stream: OpenAI sends an error event
        yield encode_event(from_exception(exc, prompt_param=prompt_param, retry_after_s=retry_after_s).body())
