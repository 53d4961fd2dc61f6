"""An engine that gives its memory back when idle and loads again on the next request.

:class:`ReloadingEngine` has the calls the server and the tray make of an :class:`Engine`
(``generate`` / ``chat`` / ``complete``, ``stats``, ``close`` and the model's facts), over a
load function it calls again when needed. ``keep_alive`` seconds after its last request ended
it closes the engine (VRAM and host memory go); the next request loads it again first, on the
caller's thread, which waits meanwhile (a request is queued, never refused, while the model
loads). Ollama's convention: ``keep_alive`` 0 unloads as soon as no request runs, ``None``
keeps the model loaded for good. The tokenizer and the model's facts stay, so requests are
tokenized and checked without the model.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from app.engine.engine import Engine
from app.engine.params import SamplingParams
from app.engine.request import PRIORITY_NORMAL, Generation
from app.engine.tokenizer import Message
from app.errors import EngineClosedError, QwenTrayError

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, int, int], None]
Loader = Callable[[ProgressCallback | None], Engine]  # progress -> a loaded engine
# What the owner is told (from any thread): "loading", "ready", "unloaded".
StateListener = Callable[[str], None]
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(ms|h|m|s))", re.IGNORECASE)
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def parse_keep_alive(text: str) -> float | None:
    """Ollama's keep_alive: "5m", "1h30m", "90s", a plain number of seconds; "0" unloads after
    each request; a negative duration ("-1", "-1m") never unloads (None)."""
    value = text.strip()
    negative = value.startswith("-")
    body = value[1:] if negative else value
    try:
        seconds = float(body)
    except ValueError:
        parts = _DURATION.findall(body)
        if not parts or "".join(n + u for n, u in parts).lower() != body.lower():
            raise QwenTrayError(f"--keep-alive: {text!r} is not a duration like 10m, 90s, 1h, 0 or -1") from None
        seconds = sum(float(n) * _UNIT_S[u.lower()] for n, u in parts)
    return None if negative else seconds


class ReloadingEngine:
    """An :class:`Engine` closed after ``keep_alive`` idle seconds and loaded again on demand."""

    def __init__(self, load: Loader, *, keep_alive: float | None = None, progress: ProgressCallback | None = None,
                 on_state: StateListener | None = None):
        self._load, self.progress, self.on_state = load, progress, on_state
        self._load_lock = threading.Lock()  # held while loading or unloading
        self._lock = threading.Lock()  # the fields below; never held across a load
        self._engine: Engine | None = load(progress)  # the first load's errors reach the caller
        self._remember(self._engine)
        self._active = 0  # requests running or being started
        self._timer: threading.Timer | None = None
        self._timer_token = 0
        self.keep_alive = keep_alive
        self.closed = False
        self.unloads = 0  # times the model was unloaded for being idle
        self._arm()

    def _remember(self, engine: Engine) -> None:
        """The model's facts, kept while it is unloaded."""
        self.spec, self.tokenizer = engine.spec, engine.tokenizer  # (not engine.loaded: it holds the weights)
        self.model_id, self.path, self.device = engine.model_id, engine.path, engine.device
        self.max_context, self.max_batch_size = engine.max_context, engine.max_batch_size
        self.kernels_unavailable = engine.kernels_unavailable

    @property
    def is_loaded(self) -> bool:
        with self._lock:
            return self._engine is not None

    @property
    def engine(self) -> Engine | None:
        """The loaded engine, or None while unloaded."""
        with self._lock:
            return self._engine

    # -- requests -----------------------------------------------------------------------------
    def chat(self, messages: list[Message], params: SamplingParams | None = None,
             priority: int = PRIORITY_NORMAL) -> Generation:
        return self.generate(self.tokenizer.encode_chat(messages), params, priority)

    def complete(self, prompt: str, params: SamplingParams | None = None, priority: int = PRIORITY_NORMAL) -> Generation:
        return self.generate(self.tokenizer.encode(prompt), params, priority)

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None,
                 priority: int = PRIORITY_NORMAL) -> Generation:
        """Like :meth:`Engine.generate`; loads the model first when it was unloaded (blocking)."""
        engine = self._acquire()
        try:
            generation = engine.generate(prompt_ids, params, priority)
        except BaseException:
            self._release()
            raise
        generation.add_done_callback(lambda _g: self._release())
        return generation

    def _acquire(self) -> Engine:
        with self._lock:
            if self.closed:
                raise EngineClosedError("the engine is shut down")
            self._active += 1
            self._cancel_timer()
            engine = self._engine
        if engine is not None:
            return engine
        try:
            return self._reload()
        except BaseException:
            self._release()
            raise

    def _reload(self) -> Engine:
        with self._load_lock:
            with self._lock:
                engine = self._engine
            if engine is not None:  # another request loaded it meanwhile
                return engine
            self._tell("loading")
            try:
                engine = self._load(self.progress)
            except BaseException:
                self._tell("unloaded")  # the next request tries again
                raise
            with self._lock:
                closed = self.closed
                self._engine = None if closed else engine
            if closed:
                engine.close()
                raise EngineClosedError("the engine was shut down while the model was loading")
            self._remember(engine)
            self._tell("ready")
            return engine

    def _release(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._arm_locked()

    # -- idle unloading --------------------------------------------------------------------------
    def set_keep_alive(self, seconds: float | None) -> None:
        """From now on unload after ``seconds`` idle (None: never); counts from now when idle."""
        with self._lock:
            self.keep_alive = seconds
            self._cancel_timer()
            if self._active == 0:
                self._arm_locked()

    def _arm(self) -> None:
        with self._lock:
            self._arm_locked()

    def _arm_locked(self) -> None:
        self._cancel_timer()
        if self.keep_alive is None or self.closed or self._engine is None:
            return
        token = self._timer_token
        self._timer = threading.Timer(max(0.0, self.keep_alive), self._expire, args=(token,))
        self._timer.name, self._timer.daemon = "qwen-tray-keep-alive", True
        self._timer.start()

    def _cancel_timer(self) -> None:
        self._timer_token += 1  # a timer already firing sees a stale token and does nothing
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, token: int) -> None:
        with self._load_lock:
            with self._lock:
                if token != self._timer_token or self._active or self._engine is None:
                    return
                engine, self._engine = self._engine, None
                self.unloads += 1
            log.info("unloading %s after %.0f s without requests", self.model_id, self.keep_alive or 0)
            engine.close()
        self._tell("unloaded")

    # -- lifecycle -------------------------------------------------------------------------------
    def stats(self) -> dict:
        engine = self.engine
        if engine is not None:
            return {**engine.stats(), "loaded": True}
        return {"running": 0, "waiting": 0, "slots": self.max_batch_size, "device": self.device,
                "model": self.model_id, "max_context": self.max_context, "loaded": False}

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._cancel_timer()
        with self._load_lock:
            with self._lock:
                engine, self._engine = self._engine, None
            if engine is not None:
                engine.close()

    def _tell(self, state: str) -> None:
        if self.on_state is not None:
            self.on_state(state)

    def __enter__(self) -> ReloadingEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
