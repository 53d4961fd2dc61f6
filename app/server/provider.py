"""Where the server gets its engine from, and whether that engine is ready.

The CLI loads the model after the socket is listening (so ``/health`` can say "loading"),
and the tray switches models under a running server. Both talk to the server through an
:class:`EngineSlot`; a plain ``Engine`` or a zero-argument callable returning the current
engine (``None`` while loading) works too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["loading", "ready", "error"]


@dataclass(slots=True, frozen=True)
class EngineStatus:
    state: State
    engine: Any = None  # app.engine.Engine when ready
    error: str | None = None  # one line, when state == "error"


class EngineSlot:
    """Thread-safe holder of the engine the server serves (the tray swaps it on a model switch)."""

    def __init__(self, engine: Any = None):
        self._lock = threading.Lock()
        self._status = EngineStatus("ready", engine) if engine is not None else EngineStatus("loading")

    def set_loading(self) -> None:
        with self._lock:
            self._status = EngineStatus("loading")

    def set_ready(self, engine: Any) -> None:
        with self._lock:
            self._status = EngineStatus("ready", engine)

    def set_error(self, message: str) -> None:
        with self._lock:
            self._status = EngineStatus("error", None, message)

    def status(self) -> EngineStatus:
        with self._lock:
            return self._status


class _CallableProvider:
    def __init__(self, get_engine: Callable[[], Any]):
        self._get_engine = get_engine

    def status(self) -> EngineStatus:
        engine = self._get_engine()
        return EngineStatus("ready", engine) if engine is not None else EngineStatus("loading")


def as_provider(engine_or_provider: Any):
    """An object with ``status() -> EngineStatus`` for an EngineSlot, an Engine or a callable."""
    if hasattr(engine_or_provider, "status") and not hasattr(engine_or_provider, "chat"):
        return engine_or_provider
    if hasattr(engine_or_provider, "chat"):
        return EngineSlot(engine_or_provider)
    if callable(engine_or_provider):
        return _CallableProvider(engine_or_provider)
    raise TypeError(f"expected an Engine, an EngineSlot or a callable returning an engine, "
                    f"got {type(engine_or_provider).__name__}")
