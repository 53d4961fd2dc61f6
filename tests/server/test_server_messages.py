"""What a client reads when it gets something wrong: through the real openai client, every 400 is one
sentence that names its field, and none quotes a Python repr of what was sent."""

from __future__ import annotations

import re

import openai
import pytest

from server_helpers import raw_request

USER = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
# Python's spellings of a dict, a list, bytes and constants: none may reach a client.
PYTHON_REPR = re.compile(r"\{'|\['|\bb'|bytearray\(|\bTrue\b|\bFalse\b|\bNone\b")

# (keyword arguments for client.chat.completions.create, param, code)
CHAT_MISTAKES = [
    ({"tools": [TOOL]}, "tools", "unsupported_parameter"),
    ({"tool_choice": {"type": "function", "function": {"name": "lookup"}}}, "tool_choice", "unsupported_value"),
    ({"tool_choice": "required"}, "tool_choice", "unsupported_value"),
    ({"functions": [{"name": "lookup", "parameters": {}}]}, "functions", "unsupported_parameter"),
    ({"function_call": {"name": "lookup"}}, "function_call", "unsupported_value"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "42"}]}, "messages[0].role",
     "unsupported_value"),
    ({"messages": [{"role": "function", "name": "lookup", "content": "42"}]}, "messages[0].role", "unsupported_value"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": ["user"], "content": "Hi"}]}, "messages[0].role", "invalid_type"),
    ({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]}]},
     "messages[1].tool_calls", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0].content[0].type", "unsupported_value"),
    ({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "Hi"}]}]},
     "messages[0].content[0].type", "invalid_type"),
    ({"messages": [{"role": "user", "content": {"text": "Hi"}}]}, "messages[0].content", "invalid_type"),
    ({"messages": [["user", "Hi"]]}, "messages[0]", "invalid_type"),
    ({"messages": []}, "messages", "empty_array"),
    ({"n": 2}, "n", "unsupported_value"),
    ({"logprobs": True, "top_logprobs": 2}, "logprobs", "unsupported_value"),
    ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
    ({"logit_bias": {"1": 5}}, "logit_bias", "unsupported_parameter"),
    ({"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    ({"temperature": "hot"}, "temperature", "invalid_type"),
    ({"temperature": [1]}, "temperature", "invalid_type"),
    ({"temperature": 3}, "temperature", "invalid_value"),
    ({"top_p": {"p": 1}}, "top_p", "invalid_type"),
    ({"max_tokens": 2.5}, "max_tokens", "invalid_type"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_value"),
    ({"max_tokens": 4, "max_completion_tokens": 5}, "max_completion_tokens", "invalid_value"),
    ({"seed": "x"}, "seed", "invalid_type"),
    ({"seed": 2**70}, "seed", "invalid_value"),
    ({"stop": {"s": 1}}, "stop", "invalid_type"),
    ({"stop": ["end", None]}, "stop[1]", "invalid_type"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage", "invalid_type"),
    ({"stream": True, "stream_options": {"include_obfuscation": "no"}}, "stream_options.include_obfuscation",
     "invalid_type"),
    ({"stream": True, "stream_options": {"include_usage": True, "chunk_size": 4}}, "stream_options.chunk_size",
     "unsupported_parameter"),
    ({"extra_body": {"stream": [True]}}, "stream", "invalid_type"),
    ({"extra_body": {"frobnicate": {"a": [1]}}}, "frobnicate", "unsupported_parameter"),
    # a boolean is not an integer and an integer not a boolean (Python's True == 1 must not let them pass)
    ({"n": True}, "n", "invalid_type"),
    ({"n": 1.0}, "n", "invalid_type"),
    ({"logprobs": 0}, "logprobs", "invalid_type"),
    ({"top_logprobs": False}, "top_logprobs", "invalid_type"),
    # content left out is missing; an explicit null on a user message is the wrong type
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"messages": [{"role": "system"}, *USER]}, "messages[0].content", "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "invalid_type"),
    # the engine's limits name the element of a list, the parameter of a single value
    ({"stop": ["end", "x" * 300]}, "stop[1]", "invalid_value"),
    ({"stop": "x" * 300}, "stop", "invalid_value"),
    # documented OpenAI parameters of features this server does not have
    ({"reasoning_effort": "low"}, "reasoning_effort", "unsupported_parameter"),
    ({"verbosity": "low"}, "verbosity", "unsupported_parameter"),
    ({"prediction": {"type": "content", "content": "Hi"}}, "prediction", "unsupported_parameter"),
    ({"web_search_options": {}}, "web_search_options", "unsupported_parameter"),
]

COMPLETION_MISTAKES = [
    ({"prompt": ["one", "two"]}, "prompt", "unsupported_value"),
    ({"prompt": {"text": "Once"}}, "prompt", "invalid_type"),
    ({"echo": True}, "echo", "unsupported_value"),
    ({"best_of": 3}, "best_of", "unsupported_value"),
    ({"logprobs": 2}, "logprobs", "unsupported_parameter"),
    ({"logprobs": 0}, "logprobs", "unsupported_parameter"),  # OpenAI answers it with the chosen tokens' logprobs
    ({"suffix": "The end."}, "suffix", "unsupported_parameter"),
    ({"n": 3}, "n", "unsupported_value"),
    ({"logit_bias": {"1": -100}}, "logit_bias", "unsupported_parameter"),
    ({"n": True}, "n", "invalid_type"),
    ({"echo": 0}, "echo", "invalid_type"),
    ({"best_of": True}, "best_of", "invalid_type"),
    ({"logprobs": False}, "logprobs", "invalid_type"),
    # a token id outside the vocabulary names its element
    ({"prompt": [99999999]}, "prompt[0]", "invalid_value"),
    ({"prompt": [[1, 99999999]]}, "prompt[0][1]", "invalid_value"),
]


def assert_reads_well(error: dict, param: str, code: str) -> None:
    """OpenAI's error fields; the message is one sentence naming ``param``, with no Python repr."""
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    message = error["message"]
    assert param in message, message
    assert not PYTHON_REPR.search(message), message
    assert message.endswith(".") and not re.search(r"[.;]\s+[A-Z]", message), message  # one sentence


def _id(case: tuple) -> str:
    return f"{case[1]}-{case[2]}"


@pytest.mark.parametrize(("arguments", "param", "code"), CHAT_MISTAKES, ids=[_id(c) for c in CHAT_MISTAKES])
def test_chat_mistakes_are_named_in_plain_words(client, engine, arguments, param, code):
    request = {"model": engine.model_id, "messages": USER, **arguments}
    if not {"max_tokens", "max_completion_tokens"} & set(arguments):
        request["max_tokens"] = 2
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**request)
    assert_reads_well(info.value.body, param, code)


@pytest.mark.parametrize(("arguments", "param", "code"), COMPLETION_MISTAKES,
                         ids=[_id(c) for c in COMPLETION_MISTAKES])
def test_completion_mistakes_are_named_in_plain_words(client, engine, arguments, param, code):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**{"model": engine.model_id, "prompt": "Once", "max_tokens": 2, **arguments})
    assert_reads_well(info.value.body, param, code)


def test_a_bad_role_lists_every_role_the_server_takes(client, engine):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=[{"role": "wizard", "content": "Hi"}])
    message = info.value.body["message"]
    assert "'wizard'" in message
    for role in ("system", "developer", "user", "assistant"):
        assert f"'{role}'" in message
    assert "'tool'" not in message and "'function'" not in message  # listed only if they worked


@pytest.mark.parametrize("role", ["tool", "function"])
def test_tool_roles_say_the_server_calls_no_tools(client, engine, role):
    message = {"role": role, "content": "42", "tool_call_id": "call_1", "name": "lookup"}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=[*USER, message])
    assert info.value.param == "messages[1].role" and info.value.code == "unsupported_value"
    assert f"does not support '{role}'" in info.value.body["message"]
    assert "does not call tools" in info.value.body["message"]


def test_tools_are_refused_saying_why(client, engine):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=USER, tools=[TOOL], tool_choice="auto")
    assert info.value.body["message"] == ("Unsupported parameter: 'tools' is not supported by this server, "
                                          "which does not call tools (function calling).")


def test_empty_tools_and_neutral_choices_are_accepted(client, engine):
    """What some clients always send, asking for nothing: accepted like OpenAI does."""
    response = client.chat.completions.create(model=engine.model_id, messages=USER, max_tokens=2, tools=[],
                                              tool_choice="none", n=1, logprobs=False,
                                              response_format={"type": "text"})
    assert len(response.choices) == 1


def test_neutral_values_of_the_exact_json_type_are_accepted(client, engine):
    """n 1, chat logprobs false, top_logprobs 0, echo false, best_of 1: accepted as before; an assistant
    turn may leave out its content. (Completions logprobs 0 is not neutral: it asks for the chosen
    tokens' log probabilities.)"""
    history = [*USER, {"role": "assistant"}, *USER]
    chat = client.chat.completions.create(model=engine.model_id, messages=history, max_tokens=2, n=1,
                                          logprobs=False, top_logprobs=0)
    assert len(chat.choices) == 1
    text = client.completions.create(model=engine.model_id, prompt="Once", max_tokens=2, n=1, echo=False,
                                     best_of=1)
    assert len(text.choices) == 1


def test_documented_openai_parameters_say_they_are_unsupported(client, engine):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=USER, reasoning_effort="high")
    assert info.value.body["message"] == ("Unsupported parameter: 'reasoning_effort' is not supported by this "
                                          "server, which does not take reasoning settings.")
    assert "Unrecognized" not in info.value.body["message"]
    assert client.chat.completions.create(model=engine.model_id, messages=USER, max_tokens=2,
                                          extra_body={"verbosity": None}).choices  # null asks for nothing


def test_a_token_id_outside_the_vocabulary_is_one_sentence(client, engine):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=engine.model_id, prompt=[5, 99999999], max_tokens=2)
    vocab = engine.spec.vocab_size
    assert info.value.body["message"] == (f"Invalid value for 'prompt[1]': token id 99999999 is not in the "
                                          f"model's vocabulary (0 to {vocab - 1}).")


def test_n_above_one_is_refused_with_the_alternative(client, engine):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=engine.model_id, messages=USER, n=2)
    assert info.value.param == "n" and "'n' can only be 1" in info.value.body["message"]
    assert "send several requests" in info.value.body["message"]


def test_an_unsigned_64_bit_seed_is_the_signed_seed_with_the_same_bits(client, engine):
    def sample(seed: int) -> str:
        return client.chat.completions.create(model=engine.model_id, messages=USER, temperature=1.0, seed=seed,
                                              max_tokens=8, extra_body={"ignore_eos": True}).choices[0].message.content

    assert sample(2**64 - 1) == sample(-1)


@pytest.mark.parametrize("raw", [b'{"model": "m", "n": 1' + b"0" * 5000 + b"}", b'{"model": "\xe9"}'])
def test_json_errors_carry_no_python_advice(server, raw):
    error = raw_request(server, "POST", "/v1/chat/completions", raw_body=raw).error
    assert error["code"] == "invalid_json"
    assert "sys." not in error["message"] and "codec" not in error["message"]
    assert not PYTHON_REPR.search(error["message"]), error["message"]
