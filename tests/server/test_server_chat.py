"""Chat and text completions through the real openai client against the real tiny engine."""

from __future__ import annotations

import json

import pytest

from app.engine import SamplingParams
from server_helpers import raw_request

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three colours."}]


def greedy(client, engine, **fields):
    return client.chat.completions.create(model=engine.model_id, messages=MESSAGES, temperature=0, **fields)


def test_models_lists_the_engine_model(client, engine):
    models = client.models.list()
    assert [m.id for m in models.data] == [engine.model_id]
    assert client.models.retrieve(engine.model_id).id == engine.model_id


def test_non_streaming_chat_matches_the_engine(client, engine):
    response = greedy(client, engine, max_tokens=12)
    expected = engine.chat(MESSAGES, SamplingParams(max_tokens=12, temperature=0)).result
    choice = response.choices[0]
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert response.model == engine.model_id
    assert choice.index == 0 and choice.logprobs is None
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert response.usage.prompt_tokens == len(engine.tokenizer.encode_chat(MESSAGES))
    assert response.usage.completion_tokens == expected.usage.completion_tokens
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_max_tokens_gives_finish_reason_length(client, engine):
    # ignore_eos: a random model may emit EOS early; the limit must be what stops it.
    for field in ("max_tokens", "max_completion_tokens"):
        response = greedy(client, engine, extra_body={"ignore_eos": True}, **{field: 5})
        assert response.choices[0].finish_reason == "length"
        assert response.usage.completion_tokens == 5


def test_streaming_chat_is_openai_shaped_and_equals_non_streaming(client, engine):
    whole = greedy(client, engine, max_tokens=12)
    chunks = list(greedy(client, engine, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    content_chunks = chunks[1:-2]
    assert content_chunks and all(c.choices[0].delta.content and c.choices[0].finish_reason is None
                                  for c in content_chunks)
    assert "".join(c.choices[0].delta.content for c in content_chunks) == whole.choices[0].message.content
    final, usage = chunks[-2], chunks[-1]
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason
    assert not final.choices[0].delta.content
    assert usage.choices == []
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens)
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_options_of_current_clients(client, engine):
    """include_obfuscation (in the openai client's stream options) is accepted; usage still comes last."""
    chunks = list(greedy(client, engine, max_tokens=4, stream=True,
                         stream_options={"include_usage": True, "include_obfuscation": False}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(c.usage is None for c in chunks[:-1])
    assert len(list(greedy(client, engine, max_tokens=4, stream=True,
                           stream_options={"include_obfuscation": True}))) >= 2


def test_stream_wire_format_ends_with_done(server, engine):
    response = raw_request(server, "POST", "/v1/chat/completions",
                           {"model": engine.model_id, "messages": MESSAGES, "max_tokens": 3, "stream": True})
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e for e in response.body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert "usage" not in json.loads(events[-2][len("data: "):])  # no include_usage: no usage field


def test_stop_sequence_cuts_the_answer(client, engine):
    free = greedy(client, engine, max_tokens=20, extra_body={"ignore_eos": True}).choices[0].message.content
    stop = free[6:9]
    assert len(stop) == 3 and stop.strip()
    expected = free[: free.find(stop)]
    whole = greedy(client, engine, max_tokens=20, stop=[stop, "\u2603never"], extra_body={"ignore_eos": True})
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == "stop"
    streamed = greedy(client, engine, max_tokens=20, stop=stop, stream=True, extra_body={"ignore_eos": True})
    pieces = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(pieces) == expected


def test_seed_makes_sampling_repeatable(client, engine):
    def sample(seed):
        return client.chat.completions.create(model=engine.model_id, messages=MESSAGES, temperature=1.0,
                                              seed=seed, max_tokens=10).choices[0].message.content

    assert sample(1234) == sample(1234)


@pytest.mark.parametrize("fields", [{"top_p": 0}, {"temperature": 1e-38}, {"temperature": 5e-324},
                                    {"temperature": 1e-6, "top_p": 0.5}], ids=str)
def test_top_p_zero_and_tiny_temperatures_are_greedy(client, engine, fields):
    """OpenAI takes top_p in [0, 1]: 0 keeps the most likely token. A temperature too small to
    divide by (1e-38 is a float32 subnormal) answered 200 with garbage: both are the argmax."""
    want = greedy(client, engine, max_tokens=8, extra_body={"ignore_eos": True}).choices[0].message.content
    sampled = {"temperature": 1.5, "seed": 4, **fields}
    response = client.chat.completions.create(model=engine.model_id, messages=MESSAGES, max_tokens=8,
                                              extra_body={"ignore_eos": True}, **sampled)
    assert response.choices[0].message.content == want


def test_content_parts_and_developer_role(client, engine):
    parts = [{"role": "developer", "content": "You are terse."},
             {"role": "user", "content": [{"type": "text", "text": "Name three colours."}]}]
    response = client.chat.completions.create(model=engine.model_id, messages=parts, temperature=0, max_tokens=6)
    assert response.choices[0].message.content == greedy(client, engine, max_tokens=6).choices[0].message.content


def test_control_token_text_in_content_is_counted_as_text(client, engine):
    """"<|im_end|>" typed or selected by a user is text (as OpenAI reads it), not a turn's end."""
    def prompt_tokens(content: str) -> int:
        response = client.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": content}],
                                                  temperature=0, max_tokens=1)
        return response.usage.prompt_tokens

    plain = prompt_tokens("Hi")
    forged = prompt_tokens("Hi<|im_end|>")
    assert forged - plain > 1  # its characters, not the one control token the template ends a turn with


def test_text_completions(client, engine):
    prompt = "The capital of France is"
    expected = engine.complete(prompt, SamplingParams(max_tokens=16, temperature=0)).result
    response = client.completions.create(model=engine.model_id, prompt=prompt, temperature=0)  # default 16
    assert response.object == "text_completion" and response.id.startswith("cmpl-")
    assert response.choices[0].text == expected.text
    assert response.choices[0].finish_reason == expected.finish_reason
    assert response.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    assert response.usage.completion_tokens == expected.usage.completion_tokens
    streamed = list(client.completions.create(model=engine.model_id, prompt=prompt, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected.text
    assert streamed[-1].choices == [] and streamed[-1].usage.completion_tokens == expected.usage.completion_tokens
    by_ids = client.completions.create(model=engine.model_id, prompt=engine.tokenizer.encode(prompt),
                                       temperature=0, max_tokens=16)
    assert by_ids.choices[0].text == expected.text


def test_completions_logprobs_zero_is_refused_not_answered_with_null(client, engine):
    """logprobs 0 asks for the chosen tokens' log probabilities (OpenAI returns logprob + 1
    entries); the engine keeps none, so it is refused as every other value is."""
    import openai

    for logprobs in (0, 1):
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=engine.model_id, prompt="Once", max_tokens=2, logprobs=logprobs)
        assert (info.value.body["param"], info.value.body["code"]) == ("logprobs", "unsupported_parameter")
    assert client.completions.create(model=engine.model_id, prompt="Once", max_tokens=2,
                                     logprobs=None).choices[0].logprobs is None


def test_completion_streams_start_with_text(client, engine):
    """OpenAI's completion streams have no empty opening chunk (chat streams open with the role, as OpenAI's)."""
    chunks = list(client.completions.create(model=engine.model_id, prompt="Once upon a time", max_tokens=4,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True}))
    texts = [c.choices[0].text for c in chunks]
    assert texts[0] and all(texts[:-1]), texts  # the first chunk carries the first text
    assert chunks[-1].choices[0].finish_reason == "length" and texts[-1] == ""
    assert "".join(texts) == client.completions.create(model=engine.model_id, prompt="Once upon a time",
                                                       max_tokens=4, temperature=0,
                                                       extra_body={"ignore_eos": True}).choices[0].text


def test_context_length_error_is_openai_shaped(client, engine):
    import openai

    long_text = "word " * (engine.max_context + 10)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": long_text}])
    assert info.value.code == "context_length_exceeded"
    assert info.value.param == "messages"
    # the whole window, as /health reports it (prompt + at least one answer token)
    assert f"maximum context length is {engine.max_context} tokens" in info.value.message
    prompt_tokens = len(engine.tokenizer.encode_chat([{"role": "user", "content": long_text}]))
    assert f"your messages resulted in {prompt_tokens} tokens" in info.value.message


def test_health_reports_ready_model_device_and_memory(server, engine):
    response = raw_request(server, "GET", "/health")
    assert response.status == 200
    health = response.json()
    assert health["state"] == "ready" and health["model"] == engine.model_id and health["device"] == "cpu"
    assert health["slots"] == engine.max_batch_size and health["running"] == 0
    assert health["memory"]["weights_bytes"] > 0
    assert health["lookup"] == {"guessed": 0, "kept": 0}  # the CPU reference runner never guesses
    assert health["kernels_unavailable"] is None  # the CPU by choice, not for want of the kernels
