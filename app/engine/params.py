"""Generation parameters and results: the data that crosses the engine's API."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from app.errors import InvalidParameterError

FinishReason = Literal["stop", "length", "cancelled"]

# Hard caps keep one request from holding a slot forever or asking for absurd stop lists.
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256


def _check(ok: bool, param: str, message: str, index: int | None = None) -> None:
    if not ok:
        raise InvalidParameterError(param, message, index)


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature == 0`` means greedy decoding (argmax); the other knobs then do nothing
    except the penalties, which change the logits before the argmax.
    """

    max_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    repetition_penalty: float = 1.0  # HF/CTRL style, over prompt and output; 1.0 = off
    presence_penalty: float = 0.0  # OpenAI style, over the output only
    frequency_penalty: float = 0.0  # OpenAI style, over the output only
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        one_stop = isinstance(self.stop, str)  # a wrong one is then the parameter, not an element of it
        self.stop = (self.stop,) if one_stop else tuple(self.stop)
        _check(isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1")
        _check(_finite(self.temperature) and 0.0 <= self.temperature <= 2.0, "temperature", "must be between 0 and 2")
        _check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an integer >= 0")
        _check(_finite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0,
               "repetition_penalty", "must be in (0, 10]")
        _check(_finite(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
               "presence_penalty", "must be between -2 and 2")
        _check(_finite(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
               "frequency_penalty", "must be between -2 and 2")
        _check(self.seed is None or (isinstance(self.seed, int) and -(2**63) <= self.seed < 2**63),
               "seed", "must be an integer that fits in 64 bits")
        _check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} stop strings")
        for i, s in enumerate(self.stop):
            _check(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH, "stop",
                   f"each stop string must be 1..{MAX_STOP_LENGTH} characters", None if one_stop else i)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(slots=True, frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True, frozen=True)
class GenerationResult:
    """The end of one generation: the whole text, why it stopped and what it cost."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    token_ids: tuple[int, ...]
    time_to_first_token_s: float
    decode_time_s: float

    @property
    def tokens_per_second(self) -> float:
        n = self.usage.completion_tokens - 1
        return n / self.decode_time_s if n > 0 and self.decode_time_s > 0 else 0.0
