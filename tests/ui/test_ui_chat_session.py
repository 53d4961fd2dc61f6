"""What the chat sends (app/ui/chat_session.py, no widgets): whole turns left out oldest first,
the answer capped at half the context, a question too long for the context refused, empty
answers never sent back, every message tokenized once; an answer stopped before its stream
exists, and one whose engine closes under a model switch."""

from __future__ import annotations

import threading

import pytest
from ui_fakes import FakeBackend

from app.engine.params import SamplingParams
from app.errors import EngineClosedError
from app.ui.chat_session import ChatAnswer, MessageTooLongError, TokenCounts, plan_request, split_turns
from app.ui.pipeline import Sink


def conversation(turns: int, question_words: int = 3, answer_words: int = 5) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"q{i} " * question_words},
                     {"role": "assistant", "content": f"a{i} " * answer_words}]
    return messages + [{"role": "user", "content": "last question"}]


def test_whole_turns_are_left_out_oldest_first_and_no_more_than_needed():
    backend = FakeBackend(max_context=80)  # counts words, +3 a message
    messages = conversation(6)
    request = plan_request(messages, TokenCounts(backend), max_tokens=20)
    sent = request.messages
    assert sent[0] == messages[0] and sent[-1] == messages[-1]
    assert sent[1]["role"] == "user"  # never an answer whose question was left out
    assert [m["role"] for m in sent[1:]] == ["user", "assistant"] * (len(sent[2:]) // 2) + ["user"]
    assert sent[1:] == messages[1 + 2 * request.dropped_turns:]
    assert 0 < request.dropped_turns < 6
    assert request.prompt_tokens == backend.count_chat_tokens(sent) and request.prompt_tokens + 20 <= 80
    one_more = [messages[0], *messages[1 + 2 * (request.dropped_turns - 1):]]
    # (the turns are chosen on estimates a token over per message: a token each may stay unused)
    assert backend.count_chat_tokens(one_more) + 20 > 80 - len(one_more)


def test_an_answer_length_past_half_the_context_is_capped_and_the_conversation_still_goes():
    backend = FakeBackend(max_context=4096)
    messages = conversation(2)
    request = plan_request(messages, TokenCounts(backend), max_tokens=4096)
    assert request.max_tokens == 2048 and request.dropped_turns == 0 and request.messages == messages


def test_a_question_too_long_for_the_context_is_refused_with_its_size():
    backend = FakeBackend(max_context=100)
    messages = [{"role": "user", "content": "word " * 200}]
    with pytest.raises(MessageTooLongError) as refused:
        plan_request(messages, TokenCounts(backend), max_tokens=20)
    assert (refused.value.tokens, refused.value.limit) == (203, 84)


def test_a_long_question_that_fits_gets_what_the_context_has_left_for_its_answer():
    backend = FakeBackend(max_context=100)
    messages = conversation(1) + [{"role": "user", "content": "word " * 70}]
    request = plan_request(messages, TokenCounts(backend), max_tokens=40)
    assert request.messages == [messages[0], messages[-1]] and request.dropped_turns == 2
    assert request.max_tokens == 100 - request.prompt_tokens < 40


def test_empty_answers_are_not_sent_back():
    backend = FakeBackend()
    messages = [{"role": "user", "content": "long prompt"}, {"role": "assistant", "content": ""},
                {"role": "user", "content": "again"}]
    request = plan_request(messages, TokenCounts(backend), max_tokens=20)
    assert [m["role"] for m in request.messages] == ["user", "user"]


def test_turns_start_at_each_question():
    messages = [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "a"},
                {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
    assert split_turns(messages) == [messages[:1], messages[1:2], messages[2:]]


class CountingBackend(FakeBackend):
    """Records every text it tokenizes."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.counted: list[str] = []
        self.chat_counts = 0

    def count_tokens(self, text):
        self.counted.append(text)
        return super().count_tokens(text)

    def count_chat_tokens(self, messages):
        self.chat_counts += 1
        return sum(super(CountingBackend, self).count_tokens(m["content"]) + 3 for m in messages)


def test_each_message_is_tokenized_once_however_long_the_conversation():
    backend = CountingBackend(max_context=400)
    counts = TokenCounts(backend)
    messages = conversation(100, question_words=20, answer_words=30)  # far past the context
    for n in range(5):  # five sends in a row
        messages = [*messages, {"role": "assistant", "content": f"answer {n}"}, {"role": "user", "content": f"next {n}"}]
        backend.chat_counts = 0
        request = plan_request(messages, counts, max_tokens=50)
        assert request.dropped_turns > 90
        # the question alone and the request (one turn fewer, rarely); the first send measures the template
        assert backend.chat_counts <= (3 if n else 5)
    assert len(backend.counted) == len(set(backend.counted))  # no text counted twice


class BlockingBackend(FakeBackend):
    """chat() blocks until ``ready`` is set: the tokenizing of a long prompt, or a reload."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.entered, self.ready = threading.Event(), threading.Event()

    def chat(self, messages, params, priority):
        self.entered.set()
        self.ready.wait(10)
        return super().chat(messages, params, priority)


def _run_in_thread(answer):
    results, deltas = [], []
    thread = threading.Thread(target=lambda: results.append(answer.run(Sink(deltas.append, lambda *a: None))))
    thread.start()
    return thread, results, deltas


def test_a_cancel_before_the_model_took_the_request_stops_the_answer():
    backend = BlockingBackend()
    answer = ChatAnswer(backend, [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=20), 0)
    thread, results, deltas = _run_in_thread(answer)
    assert backend.entered.wait(5)
    assert not answer.streaming
    answer.cancel()
    backend.ready.set()
    thread.join(5)
    assert results[0].finish_reason == "cancelled" and results[0].text == "" and deltas == []


class ClosingStream:
    """A stream whose engine closes after ``pieces`` (a model switch): it raises instead of ending."""

    def __init__(self, pieces):
        self.pieces = pieces

    def __iter__(self):
        yield from self.pieces
        raise EngineClosedError("the engine was shut down before the request finished")

    def cancel(self):
        pass


@pytest.mark.parametrize("cancelled", [True, False])
def test_an_engine_closed_under_a_cancelled_answer_ends_it_as_stopped(cancelled):
    backend = FakeBackend()
    backend.chat = lambda messages, params, priority: ClosingStream(["Photo", "synthesis "])
    answer = ChatAnswer(backend, [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=20), 0)

    def on_delta(delta):
        if cancelled:
            answer.cancel()  # the switch cancels first, then its loader closes the engine

    if not cancelled:
        with pytest.raises(EngineClosedError):  # not asked for: an error to show
            answer.run(Sink(on_delta, lambda *a: None))
        return
    result = answer.run(Sink(on_delta, lambda *a: None))
    assert (result.text, result.finish_reason) == ("Photosynthesis ", "cancelled")
