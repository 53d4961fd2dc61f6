"""Actions on text of any length: chunking with Qwen's real tokenizer, map-reduce, chunk-by-chunk."""

from __future__ import annotations

import threading

import pytest
from ui_fakes import FakeBackend

from app.engine.params import SamplingParams
from app.engine.request import PRIORITY_INTERACTIVE
from app.ui.actions import load_builtin_actions
from app.ui.pipeline import ActionPipeline, Sink, TextTooLongError, split_to_budget


def _action(action_id):
    return next(a for a in load_builtin_actions() if a.id == action_id)


def _sink():
    deltas, steps = [], []
    return Sink(deltas.append, lambda stage, done, total: steps.append((done, total))), deltas, steps


LONG_EN = "\n".join(f"Paragraph {i}: the quarterly report says revenue grew {i} percent and costs fell. "
                    f"Alice owns item {i}. Bob reviews it by Friday." for i in range(60))
LONG_ZH = "".join(f"第{i}段：季度报告显示收入增长了百分之{i}，成本下降。张三负责第{i}项，李四周五前审核。"
                  for i in range(80))


@pytest.mark.parametrize("text", [LONG_EN, LONG_ZH, "x" * 5000, "word " * 2000])
def test_split_keeps_every_character_and_fits_the_budget(text, qwen_token_counter):
    budget = 200
    pieces = split_to_budget(text, qwen_token_counter, budget)
    assert "".join(pieces) == text or "".join(pieces) == text.rstrip()  # nothing cut, nothing reordered
    assert len(pieces) > 1
    assert all(qwen_token_counter(p) <= budget for p in pieces)


def test_short_text_is_one_streamed_request_at_interactive_priority(qwen_token_counter):
    backend = FakeBackend(count=qwen_token_counter)
    sink, deltas, steps = _sink()
    pipeline = ActionPipeline(backend, _action("summarize"), SamplingParams(max_tokens=64), PRIORITY_INTERACTIVE)
    result = pipeline.run("The meeting moved to Friday at 3 pm.", sink)
    assert len(backend.requests) == 1 and steps == []
    messages, params, priority = backend.requests[0]
    assert priority == PRIORITY_INTERACTIVE and params.max_tokens == 64
    assert messages[-1]["content"].endswith("The meeting moved to Friday at 3 pm.")
    assert "".join(deltas) == result.text == "Summary: at 3 pm."


def test_an_answer_length_past_the_context_is_capped_to_half_of_it(qwen_token_counter):
    """Settings allows up to 8192 answer tokens; a 4,096-token model must still take the text."""
    backend = FakeBackend(count=qwen_token_counter, max_context=4096)
    pipeline = ActionPipeline(backend, _action("summarize"), SamplingParams(max_tokens=5000), PRIORITY_INTERACTIVE)
    result = pipeline.run("A short sentence about cats.", _sink()[0])
    (messages, params, _priority), = backend.requests
    assert params.max_tokens == 2048 and messages[-1]["content"].endswith("A short sentence about cats.")
    assert result.text


def test_long_text_is_map_reduced_not_cut(qwen_token_counter):
    backend = FakeBackend(count=qwen_token_counter, max_context=1024,
                          answer=lambda m: "partial" if "consecutive parts" not in m[-1]["content"] else "FINAL")
    sink, deltas, steps = _sink()
    pipeline = ActionPipeline(backend, _action("summarize"), SamplingParams(max_tokens=128), PRIORITY_INTERACTIVE)
    result = pipeline.run(LONG_EN, sink)
    map_requests = backend.requests[:-1]
    assert len(map_requests) >= 3
    # Every paragraph went to exactly one map request: the text was split, not truncated.
    sent = "".join(m[-1]["content"].split("\n\n", 1)[1] for m, _, _ in map_requests)
    assert sent == LONG_EN
    for messages, params, _ in backend.requests:
        assert backend.count_chat_tokens(messages) + params.max_tokens <= backend.max_context
    assert "consecutive parts" in backend.requests[-1][0][-1]["content"]
    assert "".join(deltas) == "FINAL" == result.text  # only the combined answer is streamed
    assert steps[0] == (0, len(map_requests)) and steps[-1] == (len(map_requests), len(map_requests))
    assert result.usage.completion_tokens == len(backend.requests)  # usage summed over all steps


def test_translate_long_text_streams_chunk_by_chunk(qwen_token_counter):
    backend = FakeBackend(count=qwen_token_counter, max_context=600, answer=lambda m: f"T{len(m[-1]['content'])}")
    sink, deltas, steps = _sink()
    pipeline = ActionPipeline(backend, _action("translate"), SamplingParams(max_tokens=100), PRIORITY_INTERACTIVE)
    result = pipeline.run(LONG_ZH, sink)
    assert len(backend.requests) > 2
    assert all("into English" in m[-1]["content"] for m, _, _ in backend.requests)
    assert result.text == "".join(deltas) == "\n\n".join(f"T{len(m[-1]['content'])}" for m, _, _ in backend.requests)


def test_map_reduce_that_does_not_shrink_gives_up_with_a_clear_error(qwen_token_counter):
    backend = FakeBackend(count=qwen_token_counter, max_context=600, answer=lambda m: m[-1]["content"])  # echoes
    pipeline = ActionPipeline(backend, _action("summarize"), SamplingParams(max_tokens=100), PRIORITY_INTERACTIVE)
    with pytest.raises(TextTooLongError, match="rounds"):
        pipeline.run(LONG_EN, _sink()[0])


def test_cancel_from_another_thread_stops_the_running_request(qwen_token_counter):
    gate = threading.Event()
    backend = FakeBackend(count=qwen_token_counter, gate=gate, answer=lambda m: "one two three four five")
    pipeline = ActionPipeline(backend, _action("explain"), SamplingParams(max_tokens=64), PRIORITY_INTERACTIVE)
    sink, deltas, _ = _sink()
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("result", pipeline.run("Explain KV caches.", sink)))
    worker.start()
    while not backend.requests:  # wait until the request is in flight
        worker.join(0.01)
    pipeline.cancel()
    worker.join(5)
    assert box["result"].finish_reason == "cancelled"
    assert deltas == []
