"""The local engine behind the backend protocol (``app.engine.Engine``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.engine.params import SamplingParams
from app.ui.backend.base import ChatStream, Message


class LocalEngineBackend:
    """Adapter over an ``app.engine.Engine``, or a ``ReloadingEngine`` (what :meth:`load` makes:
    it can give its memory back when idle); the same engine also serves the local API."""

    def __init__(self, engine):
        self.engine = engine
        self.name = engine.model_id
        self.device = engine.device
        self.max_context = engine.max_context
        self.kernels_unavailable = engine.kernels_unavailable

    @classmethod
    def load(cls, path: Path, progress: Callable[[str, int, int], None] | None = None,
             device: str = "auto", name: str | None = None) -> LocalEngineBackend:
        """``name``: what the model goes by (its registered name); default: the folder's name."""
        from app.engine import Engine  # imported late: torch is slow to import
        from app.engine.keep_alive import ReloadingEngine

        # The tray has no batch or context settings: on a small card it takes what fits. It
        # stays loaded until EngineHost asks for idle unloading (set_idle_unload).
        def load_engine(report):
            return Engine.load(str(path), model_id=name, device=device, progress=report, fit_to_vram=True)

        return cls(ReloadingEngine(load_engine, progress=progress))

    def chat(self, messages: list[Message], params: SamplingParams, priority: int) -> ChatStream:
        return self.engine.chat(messages, params, priority=priority)

    def count_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text))

    def count_chat_tokens(self, messages: list[Message]) -> int:
        return len(self.engine.tokenizer.encode_chat(messages))

    def vram_bytes(self) -> int | None:
        return self.engine.stats().get("cuda_reserved_bytes") if self.device == "cuda" else None

    def set_idle_unload(self, seconds: float | None, on_state: Callable[[str], None]) -> None:
        from app.engine.keep_alive import ReloadingEngine  # (loaded with the engine already)

        if isinstance(self.engine, ReloadingEngine):  # an Engine handed in from outside stays loaded
            self.engine.on_state = on_state
            self.engine.set_keep_alive(seconds)

    def close(self) -> None:
        self.engine.close()
