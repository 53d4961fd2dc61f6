"""A request inside the engine and the handle its caller streams from.

The scheduler thread produces events; the caller's thread consumes them. The only shared
state is a ``queue.Queue`` and a ``threading.Event`` for cancellation, so any thread may
call :meth:`Generation.cancel`.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from app.engine.params import GenerationResult, SamplingParams
from app.errors import QwenTrayError

log = logging.getLogger(__name__)
_ids = itertools.count(1)

# Priorities: lower runs first. A hotkey action goes ahead of a chat, a chat ahead of the API.
PRIORITY_INTERACTIVE = 0
PRIORITY_NORMAL = 10
PRIORITY_BACKGROUND = 20


class Generation:
    """Stream of text deltas for one request, then a :class:`GenerationResult`.

    Iterate it to receive ``str`` deltas as they are produced (never a split UTF-8
    character, never part of a stop string). After the iteration ends, :attr:`result`
    holds the final text, finish reason and usage. An engine error is re-raised in the
    consuming thread.
    """

    def __init__(self, request_id: int):
        self.request_id = request_id
        self._events: queue.Queue[tuple[str, object]] = queue.Queue()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Generation], None]] = []
        self._callbacks_lock = threading.Lock()

    # -- consumer side ---------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        while True:
            kind, payload = self._events.get()
            if kind == "delta":
                yield payload  # type: ignore[misc]
            elif kind == "error":
                raise payload  # type: ignore[misc]
            else:
                return

    def cancel(self) -> None:
        """Ask the engine to stop this request at the next step boundary (thread-safe)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> GenerationResult:
        """Block until the request ends and return its result (re-raises an engine error)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    @property
    def result(self) -> GenerationResult:
        return self.wait()

    def add_done_callback(self, callback: Callable[[Generation], None]) -> None:
        """Call ``callback(self)`` once the request has ended (finished, cancelled or failed): at
        once if it already has, else on the engine's thread, which it must not block."""
        with self._callbacks_lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def text(self) -> str:
        """Consume the whole stream and return the final text."""
        for _ in self:
            pass
        return self.result.text

    # -- producer side (the scheduler thread) -------------------------------------------
    def _emit(self, delta: str) -> None:
        if delta:
            self._events.put(("delta", delta))

    def _finish(self, result: GenerationResult) -> None:
        self._result = result
        self._end(("end", None))

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._end(("error", error))

    def _end(self, event: tuple[str, object]) -> None:
        with self._callbacks_lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        self._events.put(event)
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # a caller's bug must not stop the engine's thread
                log.exception("a done callback of request %d failed", self.request_id)


@dataclass(slots=True)
class Request:
    """What the scheduler tracks for one generation."""

    prompt_ids: list[int]
    params: SamplingParams
    priority: int = PRIORITY_NORMAL
    request_id: int = field(default_factory=lambda: next(_ids))
    handle: Generation = field(init=False)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise QwenTrayError("the prompt is empty")
        self.handle = Generation(self.request_id)
