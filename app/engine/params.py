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
# Below this temperature a request is greedy (the argmax). logits / T overflows float32 long
# before T reaches 0 (at 1e-38 every probability was NaN and the text garbage), and at 1e-5 a
# logit gap of 0.001 already makes the odds e^-100: the draw could not differ from the argmax.
GREEDY_TEMPERATURE = 1e-5
# top-p always keeps the most likely token, whose share is at least 1 / vocabulary; below this
# (any vocabulary under a million tokens) nothing else can stay, so top_p 0 and the like are the
# argmax, decided here once instead of by each draw (a device draw would search an empty nucleus).
GREEDY_TOP_P = 1e-6
# repetition_penalty divides the logits of seen tokens: a tiny one overflows them to inf (NaN
# probabilities); 0.01 (x100) is already far past any useful setting.
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 10.0


def _check(ok: bool, param: str, message: str, index: int | None = None) -> None:
    if not ok:
        raise InvalidParameterError(param, message, index)


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops.

    Greedy decoding (argmax) at ``temperature`` 0, or below GREEDY_TEMPERATURE, or ``top_p``
    below GREEDY_TOP_P (0 included): the other knobs then do nothing except the penalties, which
    change the logits before the argmax.
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
        _check(_finite(self.top_p) and 0.0 <= self.top_p <= 1.0, "top_p", "must be between 0 and 1")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an integer >= 0")
        _check(_finite(self.repetition_penalty)
               and MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY,
               "repetition_penalty", f"must be between {MIN_REPETITION_PENALTY:g} and {MAX_REPETITION_PENALTY:g}")
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
        """The one rule every draw follows (host and device: RequestSampler hands a runner
        temperature 0 for these)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_p < GREEDY_TOP_P


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
