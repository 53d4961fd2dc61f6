"""Run an action on text of any length: one request when it fits, chunks when it does not.

Text longer than the context is not cut. It is split at paragraph, then sentence, then
character boundaries into pieces that fit (counted with the backend's tokenizer), and
- ``map_reduce``: each piece is answered, the answers are combined with the action's
  ``combine_prompt`` (again split if the answers together are still too long);
- ``chunks``: each piece is answered in turn and the answers are joined (translate, rewrite).
Runs on a worker thread; ``cancel()`` may be called from any thread.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from app.engine.params import GenerationResult, SamplingParams, Usage
from app.errors import QwenTrayError
from app.ui.actions import Action, build_messages
from app.ui.backend.base import ChatBackend, ChatStream

MAX_REDUCE_ROUNDS = 4
SAFETY = 0.9  # chunks are packed to 90 % of the budget: joined pieces can tokenize slightly longer
# A sentence with its closing punctuation and the whitespace after it (joining them gives the text back).
_SENTENCE = re.compile(r".*?(?:[.!?。！？;；]+\s*|\Z)", re.S)


def capped_answer_length(max_tokens: int, max_context: int) -> int:
    """The answer-length setting, at most half the model's context: Settings allow up to 8192
    tokens for models with long contexts, which would leave a small one no room for the text
    (an action's) or the conversation (the chat's)."""
    return min(max_tokens, max(16, max_context // 2))


class TextTooLongError(QwenTrayError):
    """Map-reduce did not converge (the answers are as long as the text)."""


@dataclass
class Sink:
    """Where a pipeline reports: streamed text of the final answer and progress of the steps."""

    on_delta: Callable[[str], None]
    on_progress: Callable[[str, int, int], None]  # (stage, done, total)


def split_to_budget(text: str, count_tokens: Callable[[str], int], budget: int) -> list[str]:
    """Pieces of ``text`` that each count at most ``budget`` tokens, cut at the largest unit that fits."""
    if budget < 8:
        raise TextTooLongError(f"no room for text: the prompt leaves only {budget} tokens of the context")
    limit = max(8, int(budget * SAFETY))
    units = _units(text, count_tokens, limit)
    chunks: list[str] = []
    current: list[str] = []
    current_tokens = 0
    for unit, tokens in units:
        if current and current_tokens + tokens > limit:
            chunks.append("".join(current))
            current, current_tokens = [], 0
        current.append(unit)
        current_tokens += tokens
    if current:
        chunks.append("".join(current))
    return [c for c in chunks if c.strip()]


def _units(text: str, count_tokens: Callable[[str], int], limit: int) -> list[tuple[str, int]]:
    """(piece, tokens) with every piece under ``limit``: paragraphs, else sentences, else slices."""
    out: list[tuple[str, int]] = []
    for para in re.split(r"(?<=\n)", text):  # keeps the newline with its line
        n = count_tokens(para)
        if n <= limit:
            out.append((para, n))
            continue
        for sentence in (s for s in _SENTENCE.findall(para) if s):
            m = count_tokens(sentence)
            if m <= limit:
                out.append((sentence, m))
            else:
                out.extend(_slices(sentence, count_tokens, limit))
    return out


def _slices(text: str, count_tokens: Callable[[str], int], limit: int) -> list[tuple[str, int]]:
    """Character slices of ``text`` (no sentence boundary inside) each under ``limit`` tokens."""
    out = []
    start = 0
    while start < len(text):
        lo, hi = start + 1, len(text)
        while lo < hi:  # the longest slice from `start` that fits: binary search on its end
            mid = (lo + hi + 1) // 2
            if count_tokens(text[start:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append((text[start:lo], count_tokens(text[start:lo])))
        start = lo
    return out


class ActionPipeline:
    """One run of an action on one text; cancellable from any thread."""

    def __init__(self, backend: ChatBackend, action: Action, params: SamplingParams, priority: int,
                 translate_target: str = "auto"):
        self.backend, self.action = backend, action
        self.params = replace(params, max_tokens=capped_answer_length(params.max_tokens, backend.max_context))
        self.priority, self.translate_target = priority, translate_target
        self._cancel = threading.Event()
        self._current: ChatStream | None = None
        self._lock = threading.Lock()
        self._usage = [0, 0]

    def cancel(self) -> None:
        self._cancel.set()
        with self._lock:
            if self._current is not None:
                self._current.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def budget(self, template: str) -> int:
        """Tokens left for the text in one request built from ``template``."""
        empty = build_messages(self.action, "", self.translate_target, template=template)
        return self.backend.max_context - self.params.max_tokens - self.backend.count_chat_tokens(empty) - 8

    def run(self, text: str, sink: Sink) -> GenerationResult:
        if self.backend.count_tokens(text) <= self.budget(self.action.prompt):
            return self._stream(build_messages(self.action, text, self.translate_target), sink.on_delta)
        if self.action.long_text == "chunks":
            return self._run_chunks(text, sink)
        return self._run_map_reduce(text, sink)

    def _run_chunks(self, text: str, sink: Sink) -> GenerationResult:
        pieces = split_to_budget(text, self.backend.count_tokens, self.budget(self.action.prompt))
        answers: list[str] = []
        result = None
        for i, piece in enumerate(pieces):
            sink.on_progress("part", i, len(pieces))
            if i:
                sink.on_delta("\n\n")
            result = self._stream(build_messages(self.action, piece, self.translate_target), sink.on_delta)
            answers.append(result.text)
            if result.finish_reason == "cancelled":
                break
        sink.on_progress("part", len(pieces), len(pieces))
        return self._combined_result("\n\n".join(answers), result)

    def _run_map_reduce(self, text: str, sink: Sink) -> GenerationResult:
        template = self.action.prompt
        for _round in range(MAX_REDUCE_ROUNDS):
            pieces = split_to_budget(text, self.backend.count_tokens, self.budget(template))
            answers = []
            for i, piece in enumerate(pieces):
                sink.on_progress("part", i, len(pieces))
                messages = build_messages(self.action, piece, self.translate_target, template=template)
                result = self._stream(messages, None)
                if result.finish_reason == "cancelled":
                    return self._combined_result("", result)
                answers.append(result.text.strip())
            sink.on_progress("part", len(pieces), len(pieces))
            text, template = "\n\n".join(answers), self.action.combine_prompt
            if self.backend.count_tokens(text) <= self.budget(template):
                final = self._stream(build_messages(self.action, text, self.translate_target, template=template),
                                     sink.on_delta)
                return self._combined_result(final.text, final)
        raise TextTooLongError(f"text still too long after {MAX_REDUCE_ROUNDS} rounds of summarizing")

    def _stream(self, messages: list[dict[str, str]], on_delta: Callable[[str], None] | None) -> GenerationResult:
        with self._lock:
            if self._cancel.is_set():
                return GenerationResult("", "cancelled", Usage(0, 0), (), 0.0, 0.0)
            stream = self.backend.chat(messages, self.params, self.priority)
            self._current = stream
        try:
            for delta in stream:
                if on_delta is not None:
                    on_delta(delta)
            result = stream.result
        finally:
            with self._lock:
                self._current = None
        self._usage[0] += result.usage.prompt_tokens
        self._usage[1] += result.usage.completion_tokens
        return result

    def _combined_result(self, text: str, last: GenerationResult | None) -> GenerationResult:
        """One result for a multi-request run: the joined text, total usage, the last step's timings."""
        usage = Usage(*self._usage)
        if last is None:
            return GenerationResult(text, "stop", usage, (), 0.0, 0.0)
        return GenerationResult(text, last.finish_reason, usage, (), last.time_to_first_token_s, last.decode_time_s)
