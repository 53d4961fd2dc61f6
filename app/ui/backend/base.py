"""The small protocol that actions, chat and the tray use for any model.

``backend.chat(messages, params, priority)`` returns a :class:`ChatStream`: iterate it for
text deltas (blocking, so a worker thread does it), then read ``.result``
(:class:`~app.engine.params.GenerationResult`); ``.cancel()`` is thread-safe. The local
engine's ``Generation`` already has exactly this shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from app.engine.params import GenerationResult, SamplingParams

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@runtime_checkable
class ChatStream(Protocol):
    def __iter__(self) -> Iterator[str]: ...

    @property
    def result(self) -> GenerationResult: ...

    def cancel(self) -> None: ...


@runtime_checkable
class ChatBackend(Protocol):
    name: str  # shown in the tooltip and menus
    device: str  # "cuda" | "cpu" | "remote"
    max_context: int  # tokens per request (prompt + answer)
    kernels_unavailable: str | None  # why a GPU machine runs it without the CUDA kernels (Engine's)

    def chat(self, messages: list[Message], params: SamplingParams, priority: int) -> ChatStream: ...

    def count_tokens(self, text: str) -> int: ...

    def count_chat_tokens(self, messages: list[Message]) -> int: ...

    def vram_bytes(self) -> int | None:
        """GPU memory the model holds now (PyTorch's reserved memory), None when not on a GPU."""
        ...

    def set_idle_unload(self, seconds: float | None, on_state: Callable[[str], None]) -> None:
        """Give the model's memory back after ``seconds`` without requests (None: never) and load
        it again for the next one; ``on_state`` hears "unloaded", "loading", "ready" from any
        thread. A backend that holds no model (a remote one) does nothing."""
        ...

    def close(self) -> None: ...
