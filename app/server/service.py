"""What the API's routes share: the config, the engine provider, admission and running requests.

No HTTP here: the routes (routes.py) call it from the event loop, the tray and tests read its
counters from their own threads, so every counter is behind one lock.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from app.server.config import ServerConfig
from app.server.errors import ApiError, unavailable
from app.server.provider import EngineStatus


class ActiveRequest:
    """A generation being served; ``on_client_gone`` runs when its client disconnects."""

    def __init__(self, generation: Any):
        self.generation = generation
        self.client_gone = False

    def on_client_gone(self) -> None:
        self.client_gone = True
        self.generation.cancel()

    @property
    def cut_short(self) -> bool:
        """The client left and its generation was stopped before it finished on its own."""
        if not (self.client_gone and self.generation.done):
            return False
        try:
            return self.generation.result.finish_reason == "cancelled"
        except Exception:  # noqa: BLE001 - the generation failed: it was not cut short by us
            return False


class ApiService:
    def __init__(self, config: ServerConfig, provider: Any):
        self.config = config
        self.provider = provider
        self.created = int(time.time())
        self.stopping = False
        self.disconnects = 0  # generations cut short because their client left
        self._lock = threading.Lock()
        self._active: set[ActiveRequest] = set()
        self._admitted = 0

    # -- engine access --------------------------------------------------------------------------
    def engine_status(self) -> EngineStatus:
        status = self.provider.status()
        if status.state == "ready" and getattr(status.engine, "closed", False):
            return EngineStatus("loading")  # the tray closed it to switch models; the next one is coming
        return status

    def ready_engine(self) -> tuple[Any, str]:
        """The engine and the model id clients must use, or a 503 while loading/stopping."""
        if self.stopping:
            raise unavailable("The server is shutting down.", "server_shutting_down", self.config.retry_after_s)
        status = self.engine_status()
        if status.state != "ready":
            raise loading_error(status.state, status.error, self.config.retry_after_s)
        return status.engine, self.config.model_id or status.engine.model_id

    def serves(self, engine: Any, model_id: str, requested: str) -> bool:
        """Whether a request naming ``requested`` is for this model: its id, or, unless the id was
        chosen with --model-id, the name of its folder (what the id was before models were known
        by their registered names)."""
        if requested == model_id:
            return True
        return self.config.model_id is None and engine.path is not None and requested == Path(engine.path).name

    def health(self) -> tuple[int, dict]:
        status = self.engine_status()
        body: dict = {"state": status.state, "model": self.config.model_id, "device": None}
        if status.state == "ready":
            engine = status.engine
            stats = engine.stats()
            body.update(model=self.config.model_id or engine.model_id, device=engine.device,
                        max_context=engine.max_context, max_batch_size=engine.max_batch_size,
                        kernels_unavailable=engine.kernels_unavailable,
                        loaded=stats.get("loaded", True))  # False: unloaded when idle, the next request loads it
            for key in ("running", "waiting", "slots"):
                if key in stats:
                    body[key] = stats[key]
            body["memory"] = {k: v for k, v in stats.items() if k.endswith("_bytes")} or None  # weights, KV cache
            if "lookup_guessed" in stats:  # tokens guessed from the requests' own text, and kept
                body["lookup"] = {"guessed": stats["lookup_guessed"], "kept": stats["lookup_kept"]}
        elif status.state == "error":
            body["error"] = status.error
        ready = status.state == "ready" and not self.stopping
        return (200 if ready else 503), body

    # -- admission and tracking -----------------------------------------------------------------
    def admit(self, engine: Any) -> None:
        """Count a request in, or 429 when ``max_batch_size + max_queued`` are running or waiting.

        Every successful call is paired with one :meth:`release`.
        """
        limit = engine.max_batch_size + self.config.max_queued
        with self._lock:
            if self._admitted >= limit:
                raise ApiError(429, f"Too many requests: {self._admitted} are already running or waiting "
                                    f"(limit {limit}); retry later.", type="requests", code="rate_limit_exceeded",
                               headers={"Retry-After": str(self.config.retry_after_s)})
            self._admitted += 1

    def release(self) -> None:
        with self._lock:
            self._admitted -= 1

    def begin(self, active: ActiveRequest) -> None:
        with self._lock:
            self._active.add(active)
            if self.stopping:
                active.generation.cancel()

    def end(self, active: ActiveRequest) -> None:
        with self._lock:
            self._active.discard(active)
            if active.cut_short:
                self.disconnects += 1

    def stats(self) -> dict:
        with self._lock:
            return {"active": len(self._active), "admitted": self._admitted, "disconnects": self.disconnects}

    def stop(self) -> None:
        """Refuse new work and cancel what runs: streams end with a "shutting down" error event."""
        with self._lock:
            self.stopping = True
            for active in self._active:
                active.generation.cancel()


def loading_error(state: str, error: str | None, retry_after_s: int) -> ApiError:
    if state == "error":
        return unavailable(f"The model failed to load: {error}", "model_load_failed", retry_after_s)
    return unavailable("The model is still loading; retry shortly.", "model_loading", retry_after_s)
