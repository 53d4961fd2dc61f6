"""Per-request state while it holds a KV-cache slot: tokens, sampler, text pipeline."""

from __future__ import annotations

import time

from app.engine.detokenizer import IncrementalDetokenizer
from app.engine.params import FinishReason, GenerationResult, Usage
from app.engine.request import Request
from app.engine.sampling import RequestSampler
from app.engine.stops import StopStringMatcher
from app.engine.tokenizer import Tokenizer


class Sequence:
    """``all_ids`` = prompt + generated; ``cached`` of them are in the KV cache.

    The model must still run ``all_ids[cached:]``: more than one token means a (possibly
    chunked) prefill, exactly one means a decode step. A preempted sequence simply gets
    ``cached = 0`` and is prefilled again later.
    """

    def __init__(self, request: Request, tokenizer: Tokenizer, vocab_size: int, eos_ids: frozenset[int]):
        self.request = request
        self.params = request.params
        self.prompt_len = len(request.prompt_ids)
        self.all_ids: list[int] = list(request.prompt_ids)
        self.cached = 0
        self.slot: int | None = None
        self.eos_ids = frozenset() if request.params.ignore_eos else eos_ids
        self.sampler = RequestSampler(request.params, request.prompt_ids, vocab_size)
        self.detok = IncrementalDetokenizer(tokenizer, request.prompt_ids)
        self.stops = StopStringMatcher(request.params.stop)
        self.text_parts: list[str] = []
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.finished: FinishReason | None = None
        self.lookup = None  # app.engine.lookup.SequenceLookup, made by the scheduler when it guesses

    @property
    def handle(self):
        return self.request.handle

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def generated(self) -> int:
        return len(self.all_ids) - self.prompt_len

    @property
    def pending(self) -> list[int]:
        return self.all_ids[self.cached:]

    @property
    def is_decoding(self) -> bool:
        return len(self.all_ids) - self.cached == 1

    def accept(self, token_id: int, max_context: int) -> None:
        """Append a sampled token, stream its text, and decide whether the request ends."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.all_ids.append(token_id)
        self.sampler.observe(token_id)
        if token_id in self.eos_ids:
            self._finish("stop")
            return
        text, hit_stop = self.stops.feed(self.detok.add(token_id))
        self._emit(text)
        if hit_stop:
            self._finish("stop", flush=False)
        elif self.generated >= self.params.max_tokens or len(self.all_ids) >= max_context:
            self._finish("length")

    def cancel(self) -> None:
        self._finish("cancelled")

    def _emit(self, text: str) -> None:
        if text:
            self.text_parts.append(text)
            self.handle._emit(text)

    def _finish(self, reason: FinishReason, flush: bool = True) -> None:
        if flush:
            # Text held back as half a character or a possible stop string is output after all.
            tail, hit_stop = self.stops.feed(self.detok.flush())
            self._emit(tail if hit_stop else tail + self.stops.flush())
        self.finished = reason

    def result(self) -> GenerationResult:
        end = time.perf_counter()
        first = self.first_token_at or end
        output_ids = tuple(self.all_ids[self.prompt_len:])
        return GenerationResult(
            text="".join(self.text_parts),
            finish_reason=self.finished or "cancelled",
            usage=Usage(prompt_tokens=self.prompt_len, completion_tokens=len(output_ids)),
            token_ids=output_ids,
            time_to_first_token_s=first - self.submitted_at,
            decode_time_s=end - first,
        )
