"""The chat's requests, without widgets: which turns of a conversation fit the model's context,
and one answer that can be stopped at any moment.

A request holds the system message (an action's instructions, from Continue in chat), as many of
the newest turns as fit, and the new question. A turn is a question with its answer: turns are
left out whole, oldest first, so a request never starts with an answer to a question the model
no longer sees (chat templates that need user/assistant alternation refuse that). Empty answers
(stopped before their first token) are never sent back. The answer gets at most half the context
(as actions do, app/ui/pipeline.py), so a long answer-length setting still leaves room for the
conversation; a question too long for the context even alone is refused before anything is sent.

Each message's text is tokenized once (TokenCounts), the turns are chosen on those counts, and the
request is counted once more, exactly: a send costs time linear in the conversation, not a
recount of it per turn left out.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from app.engine.params import GenerationResult, SamplingParams, Usage
from app.errors import EngineClosedError, QwenTrayError
from app.ui.backend.base import ChatBackend, ChatStream, Message
from app.ui.pipeline import Sink, capped_answer_length

MIN_ANSWER_TOKENS = 16  # Settings' smallest answer length: a question leaving less room is too long


class MessageTooLongError(QwenTrayError):
    """The new question (with the system message) leaves no room for an answer in the context."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"the message has {tokens} tokens; the context holds at most {limit} with room to answer")
        self.tokens, self.limit = tokens, limit


@dataclass(frozen=True)
class ChatRequest:
    messages: list[Message]
    max_tokens: int  # the answer's length: the setting, capped to fit the context
    prompt_tokens: int
    dropped_turns: int  # older questions (with their answers) left out to fit


class TokenCounts:
    """Token counts for one backend (its tokenizer and chat template): each message text is
    counted once, and what the template adds around a message is measured once."""

    def __init__(self, backend: ChatBackend):
        self.backend = backend
        self._counts: dict[str, int] = {}
        self._per_message: int | None = None

    def text(self, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = self.backend.count_tokens(text)
        return self._counts[text]

    def message(self, message: Message) -> int:
        """About what ``message`` adds to a request: its text and the template's markers around it."""
        if self._per_message is None:
            self._per_message = self._template_tokens_per_message()
        return self.text(message["content"]) + self._per_message

    def _template_tokens_per_message(self) -> int:
        # Measured on a question, answer, question (templates that need alternation accept that);
        # one token more: a text can tokenize one longer beside the markers than alone.
        question, answer = {"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}
        alone = self.backend.count_chat_tokens([question])
        three = self.backend.count_chat_tokens([question, answer, question])
        return max(0, math.ceil((three - alone - 2 * self.text("x")) / 2)) + 1

    def keep_only(self, texts: set[str]) -> None:
        """Forget the texts no longer asked about (another conversation is shown)."""
        self._counts = {text: n for text, n in self._counts.items() if text in texts}


def split_turns(messages: list[Message]) -> list[list[Message]]:
    """Turns: each question with the messages after it up to the next question (answers before
    the first question, from a hand-edited file, are a turn of their own)."""
    turns: list[list[Message]] = []
    for message in messages:
        if message["role"] == "user" or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return turns


def plan_request(messages: list[Message], counts: TokenCounts, max_tokens: int) -> ChatRequest:
    """The request answering ``messages`` (the last one is the new question) within the context
    of ``counts.backend``. Raises MessageTooLongError when the question alone cannot be answered
    in it."""
    backend = counts.backend
    messages = [m for m in messages if m["role"] != "assistant" or m["content"].strip()]
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = split_turns(messages[len(system):])
    question = turns.pop()
    question_tokens = backend.count_chat_tokens(system + question)
    limit = backend.max_context - MIN_ANSWER_TOKENS
    if question_tokens > limit:
        raise MessageTooLongError(question_tokens, limit)
    answer_tokens = capped_answer_length(max_tokens, backend.max_context)
    budget = backend.max_context - answer_tokens
    kept = _newest_turns_within(turns, counts, budget - question_tokens)
    while True:
        request = system + [m for turn in kept for m in turn] + question
        prompt_tokens = backend.count_chat_tokens(request) if kept else question_tokens
        if prompt_tokens <= budget or not kept:
            break
        kept.pop(0)  # the estimate was short: one turn fewer
    # A question longer than the rest of the budget is still answered, in what the context has left.
    answer_tokens = min(answer_tokens, backend.max_context - prompt_tokens)
    return ChatRequest(request, answer_tokens, prompt_tokens, len(turns) - len(kept))


def _newest_turns_within(turns: list[list[Message]], counts: TokenCounts, room: int) -> list[list[Message]]:
    """The newest turns whose estimated tokens fit ``room``; none older than one that does not fit."""
    newest_first: list[list[Message]] = []
    for turn in reversed(turns):
        tokens = sum(counts.message(m) for m in turn)
        if tokens > room:
            break
        newest_first.append(turn)
        room -= tokens
    return newest_first[::-1]


def finish_of(result: GenerationResult) -> str:
    """ChatMessage.finish for how a generation ended ("" when it ended by itself)."""
    return {"cancelled": "stopped", "length": "length"}.get(result.finish_reason, "")


class ChatAnswer:
    """One answer, streamed by a StreamTask's thread (``run``); ``cancel()`` from any thread stops it,
    also before its stream exists: ``backend.chat()`` tokenizes, and first loads an idle-unloaded
    model again, which takes seconds for a large one."""

    def __init__(self, backend: ChatBackend, messages: list[Message], params: SamplingParams, priority: int):
        self._backend, self._messages, self._params, self._priority = backend, messages, params, priority
        self._lock = threading.Lock()  # the two fields below
        self._cancelled = False
        self._stream: ChatStream | None = None

    @property
    def streaming(self) -> bool:
        """Whether the model has taken the request (the answer's tokens are on their way)."""
        with self._lock:
            return self._stream is not None

    @property
    def cancelled(self) -> bool:
        with self._lock:
            return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def run(self, sink: Sink) -> GenerationResult:
        written: list[str] = []
        try:
            if self.cancelled:
                return _stopped("")
            stream = self._backend.chat(self._messages, self._params, self._priority)
            with self._lock:
                self._stream = stream
                cancelled = self._cancelled
            if cancelled:  # asked for while the request was being read or the model loaded
                stream.cancel()
            for delta in stream:
                written.append(delta)
                sink.on_delta(delta)
            return stream.result
        except EngineClosedError:
            # A model switch cancels the answer and closes the engine at the same time: whichever
            # comes first, the user asked for it, and what was written is kept as stopped.
            if not self.cancelled:
                raise
            return _stopped("".join(written))


def _stopped(text: str) -> GenerationResult:
    return GenerationResult(text, "cancelled", Usage(0, 0), (), 0.0, 0.0)
