"""OpenAI's response bodies: whole answers, stream chunks, usage, the model list.

Pure functions and a small dataclass: no sockets, no engine.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["chat", "completion"]


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(slots=True)
class ResponseBuilder:
    """Builds the bodies of one response; every chunk of a stream shares id and created."""

    kind: Kind
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl-" if self.kind == "chat" else "cmpl-"
            self.id = prefix + uuid.uuid4().hex

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def opening(self, text: str | None) -> list[dict]:
        """A stream's first chunks, ``text`` the first delta (None when the answer is empty).

        A chat stream opens with the role and empty content, as OpenAI's do; a completion stream
        has no such chunk (OpenAI's start with the first text).
        """
        chunks = [self.chunk(first=True)] if self.kind == "chat" else []
        return chunks + ([self.chunk(text)] if text else [])

    def chunk(self, text: str | None = None, *, first: bool = False, finish_reason: str | None = None) -> dict:
        """One streamed chunk: the first carries the role (chat), the last the finish reason."""
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if first else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._envelope(obj, [])
        body["usage"] = usage_dict(prompt_tokens, completion_tokens)
        return body

    def full(self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage_dict(prompt_tokens, completion_tokens)
        return body


def models_list(model_id: str, created: int) -> dict:
    return {"object": "list", "data": [model_card(model_id, created)]}


def model_card(model_id: str, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "qwen-tray"}
