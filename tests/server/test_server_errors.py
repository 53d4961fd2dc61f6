"""Every bad input gets OpenAI's error body with the right status, param and code."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from app.server import EngineSlot
from server_helpers import chat_body, raw_request, wait_until

M = "MODEL"  # replaced by the engine's model id

CHAT_ERRORS = [
    # (body fields overriding a valid request, status, param, code)
    ({"model": None}, 400, "model", "missing_model"),
    ({"model": 5}, 400, "model", "invalid_type"),
    ({"model": "gpt-4o"}, 404, "model", "model_not_found"),
    ({"messages": None}, 400, "messages", "missing_required_parameter"),
    ({"messages": "hi"}, 400, "messages", "invalid_type"),
    ({"messages": []}, 400, "messages", "empty_array"),
    ({"messages": ["hi"]}, 400, "messages[0]", "invalid_type"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role", "unsupported_value"),
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, 400, "messages[0].role", "unsupported_value"),
    ({"messages": [{"role": "bogus", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
    ({"messages": [{"content": "x"}]}, 400, "messages[0].role", "missing_required_parameter"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]},
     400, "messages[0].tool_calls", "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content[0].type", "unsupported_value"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, 400, "messages[0].content[0].type",
     "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "invalid_type"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools", "unsupported_parameter"),
    ({"tool_choice": "required"}, 400, "tool_choice", "unsupported_value"),
    ({"logprobs": True}, 400, "logprobs", "unsupported_value"),
    ({"n": 2}, 400, "n", "unsupported_value"),
    ({"response_format": {"type": "json_object"}}, 400, "response_format", "unsupported_value"),
    ({"logit_bias": {"1": 5}}, 400, "logit_bias", "unsupported_parameter"),
    ({"moderation": {"model": "omni-moderation-latest"}}, 400, "moderation", "unsupported_parameter"),
    ({"frobnicate": 1}, 400, "frobnicate", "unsupported_parameter"),
    ({"temperature": 3}, 400, "temperature", "invalid_value"),
    ({"temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({"top_p": 1.5}, 400, "top_p", "invalid_value"),
    ({"top_p": -0.1}, 400, "top_p", "invalid_value"),
    ({"top_k": -5}, 400, "top_k", "invalid_value"),
    ({"max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"max_tokens": 2.5}, 400, "max_tokens", "invalid_type"),
    ({"max_completion_tokens": 0, "max_tokens": None}, 400, "max_completion_tokens", "invalid_value"),
    ({"max_tokens": 4, "max_completion_tokens": 5}, 400, "max_completion_tokens", "invalid_value"),
    ({"presence_penalty": 5}, 400, "presence_penalty", "invalid_value"),
    ({"frequency_penalty": -3}, 400, "frequency_penalty", "invalid_value"),
    ({"repetition_penalty": 0}, 400, "repetition_penalty", "invalid_value"),
    ({"repetition_penalty": 1e-38}, 400, "repetition_penalty", "invalid_value"),
    ({"seed": "x"}, 400, "seed", "invalid_type"),
    ({"seed": 2**70}, 400, "seed", "invalid_value"),
    ({"stop": ["s"] * 17}, 400, "stop", "invalid_value"),
    ({"stop": 5}, 400, "stop", "invalid_type"),
    ({"stop": ["a", 1]}, 400, "stop[1]", "invalid_type"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options", "invalid_value"),
    ({"stream": True, "stream_options": {"x": 1}}, 400, "stream_options.x", "unsupported_parameter"),
    ({"stream": "yes"}, 400, "stream", "invalid_type"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage", "invalid_type"),
]


@pytest.mark.parametrize(("fields", "status", "param", "code"), CHAT_ERRORS,
                         ids=[f"{next(iter(c[0]))}-{c[2]}" for c in CHAT_ERRORS])
def test_bad_chat_request(server, engine, fields, status, param, code):
    body = {k: v for k, v in {**chat_body(engine.model_id, max_tokens=2), **fields}.items() if v is not None}
    response = raw_request(server, "POST", "/v1/chat/completions", body)
    assert response.status == status
    error = response.error
    assert (error["param"], error["code"]) == (param, code)
    assert error["type"] == "invalid_request_error" and error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_a_bad_sampling_value_is_named_by_its_api_field(server, engine):
    """The field the client sent (top_p), not the CLI's option (--top-p)."""
    response = raw_request(server, "POST", "/v1/chat/completions", {**chat_body(engine.model_id), "top_p": 1.5})
    assert response.status == 400
    assert response.error["message"] == "Invalid value for 'top_p': must be between 0 and 1."
    assert response.error["param"] == "top_p" and "--" not in response.error["message"]


COMPLETION_ERRORS = [
    ({"prompt": ["a", "b"]}, 400, "prompt", "unsupported_value"),
    ({"prompt": None}, 400, "prompt", "missing_required_parameter"),
    ({"prompt": ""}, 400, "prompt", "invalid_value"),
    ({"prompt": [1, 10**9]}, 400, "prompt[1]", "invalid_value"),
    ({"echo": True}, 400, "echo", "unsupported_value"),
    ({"best_of": 3}, 400, "best_of", "unsupported_value"),
    ({"logprobs": 2}, 400, "logprobs", "unsupported_parameter"),
    ({"logprobs": 0}, 400, "logprobs", "unsupported_parameter"),  # OpenAI answers 0 with the chosen tokens' logprobs
    ({"logprobs": False}, 400, "logprobs", "invalid_type"),
    ({"suffix": "end"}, 400, "suffix", "unsupported_parameter"),
    ({"messages": []}, 400, "messages", "unsupported_parameter"),
]


@pytest.mark.parametrize(("fields", "status", "param", "code"), COMPLETION_ERRORS,
                         ids=[c[2] + "-" + str(i) for i, c in enumerate(COMPLETION_ERRORS)])
def test_bad_completion_request(server, engine, fields, status, param, code):
    body = {"model": engine.model_id, "prompt": "Once", "max_tokens": 2, **fields}
    response = raw_request(server, "POST", "/v1/completions", body)
    assert response.status == status
    assert (response.error["param"], response.error["code"]) == (param, code)


def test_prompt_past_the_context_names_the_limit(server, engine):
    body = {"model": engine.model_id, "prompt": "word " * (engine.max_context + 5)}
    response = raw_request(server, "POST", "/v1/completions", body)
    assert response.status == 400
    assert response.error["code"] == "context_length_exceeded" and response.error["param"] == "prompt"
    health = raw_request(server, "GET", "/health").json()
    assert f"maximum context length is {health['max_context']} tokens" in response.error["message"]
    assert health["max_context"] == engine.max_context


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe\x00garbage", b""])
def test_malformed_json_is_400(server, raw):
    response = raw_request(server, "POST", "/v1/chat/completions", raw_body=raw)
    assert response.status == 400
    assert response.error["code"] == "invalid_json"


def test_unknown_path_and_wrong_method(server):
    assert raw_request(server, "GET", "/v1/embeddings").status == 404
    assert raw_request(server, "GET", "/").error["code"] == "not_found"
    response = raw_request(server, "GET", "/v1/chat/completions")
    assert response.status == 405 and "POST" in response.headers["allow"]
    assert response.error["message"] == "Method GET is not allowed here; use POST."
    assert raw_request(server, "DELETE", "/v1/models").status == 405
    assert raw_request(server, "GET", "/v1/models/nope").error["code"] == "model_not_found"


@pytest.mark.parametrize(("method", "path"), [("DELETE", "/v1/models/MODEL"), ("POST", "/health"),
                                              ("PUT", "/v1/models")])
def test_a_wrong_method_on_a_get_route_names_get(server, engine, method, path):
    """Starlette's Allow is "HEAD, GET": its first entry, HEAD, is not what a client wants."""
    body = None if method == "DELETE" else {}
    response = raw_request(server, method, path.replace("MODEL", engine.model_id), body=body)
    assert response.status == 405 and response.error["code"] == "method_not_allowed"
    assert response.error["message"] == f"Method {method} is not allowed here; use GET."
    assert "GET" in response.headers["allow"]
    from app.server.routes import _methods_to_use  # Starlette's order is a set's: test both

    assert _methods_to_use("HEAD, GET") == _methods_to_use("GET, HEAD") == "GET"
    assert _methods_to_use("POST") == "POST" and _methods_to_use("HEAD") == "HEAD"


@pytest.mark.parametrize("path", ["/v1/", "/v1", "/chat/completions", "/"])
def test_an_unknown_path_lists_the_served_ones(server, path):
    """"/v1/" said "Unknown path /v1; the API is under /v1.": it is under /v1, not at it."""
    response = raw_request(server, "GET", path)
    assert response.status == 404 and response.error["code"] == "not_found"
    assert response.error["message"] == (f"Unknown path {path.rstrip('/') or '/'}; this server serves "
                                         "/v1/chat/completions, /v1/completions, /v1/models and /health.")


@pytest.mark.parametrize(("method", "path", "endpoint"), [
    ("POST", "/v1/embeddings", "/v1/embeddings"), ("POST", "/v1/responses", "/v1/responses"),
    ("GET", "/v1/responses/resp_1", "/v1/responses"), ("POST", "/v1/audio/speech", "/v1/audio"),
    ("POST", "/v1/images/generations", "/v1/images")])
def test_openai_endpoints_this_server_lacks_say_so(server, method, path, endpoint):
    response = raw_request(server, method, path, {"model": "m", "input": "hi"} if method == "POST" else None)
    assert response.status == 404
    error = response.error
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "not_found"
    assert error["message"] == (f"This server does not support OpenAI's {endpoint} API; it serves "
                                "/v1/chat/completions, /v1/completions and /v1/models.")


def test_openai_client_learns_embeddings_and_responses_are_not_served(server, client, engine):
    import openai

    with pytest.raises(openai.NotFoundError, match="does not support OpenAI's /v1/embeddings API"):
        client.embeddings.create(model=engine.model_id, input="hi")
    with pytest.raises(openai.NotFoundError, match="/v1/chat/completions"):
        client.responses.create(model=engine.model_id, input="hi")
    assert raw_request(server, "GET", "/v1/frobnicate").error["message"] == (
        "Unknown path /v1/frobnicate; this server serves /v1/chat/completions, /v1/completions, /v1/models and "
        "/health.")


def test_protocol_errors_are_json_too(server):
    response = raw_request(server, "BREW", "/v1/models")  # http.server's own 501
    assert response.status == 501
    assert response.headers["content-type"] == "application/json"
    assert response.error["message"]


def test_unexpected_failure_is_a_500_without_traceback(server, engine, monkeypatch, caplog):
    def broken_stats():
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(engine, "stats", broken_stats)
    response = raw_request(server, "GET", "/health")
    assert response.status == 500
    assert response.error["type"] == "server_error" and response.error["code"] == "internal_error"
    assert b"secret" not in response.body and b"Traceback" not in response.body
    assert "secret internal detail" in caplog.text  # the log keeps the details


def test_loading_and_failed_states(make_server, engine):
    slot = EngineSlot()
    handle = make_server(slot)
    health = raw_request(handle, "GET", "/health")
    assert health.status == 503 and health.json()["state"] == "loading"
    response = raw_request(handle, "POST", "/v1/chat/completions", chat_body(engine.model_id))
    assert response.status == 503 and response.error["code"] == "model_loading"
    assert response.headers["retry-after"] == "1"
    slot.set_ready(engine)
    assert raw_request(handle, "GET", "/health").json()["state"] == "ready"
    assert raw_request(handle, "POST", "/v1/chat/completions", chat_body(engine.model_id, max_tokens=2)).status == 200
    slot.set_error("model.safetensors: file not found")
    health = raw_request(handle, "GET", "/health").json()
    assert health["state"] == "error" and "safetensors" in health["error"]
    assert raw_request(handle, "GET", "/v1/models").error["code"] == "model_load_failed"


def test_model_id_override(make_server, engine):
    handle = make_server(model_id="qwen2.5-3b-instruct")
    assert raw_request(handle, "GET", "/v1/models").json()["data"][0]["id"] == "qwen2.5-3b-instruct"
    ok = raw_request(handle, "POST", "/v1/chat/completions", chat_body("qwen2.5-3b-instruct", max_tokens=2))
    assert ok.status == 200 and ok.json()["model"] == "qwen2.5-3b-instruct"
    assert raw_request(handle, "POST", "/v1/chat/completions", chat_body(engine.model_id)).status == 404


def test_callable_provider_and_model_switch(make_server, engine, tiny_qwen_dir):
    """The tray passes ``lambda: current engine or None``; a closed engine answers 503, not 500."""
    from app.engine import Engine

    current = {"engine": None}
    handle = make_server(lambda: current["engine"])
    assert raw_request(handle, "GET", "/health").json()["state"] == "loading"
    old = Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1)
    current["engine"] = old
    assert raw_request(handle, "POST", "/v1/chat/completions", chat_body(old.model_id, max_tokens=2)).status == 200
    with ThreadPoolExecutor(1) as pool:  # a request running while the tray unloads the model
        running = pool.submit(raw_request, handle, "POST", "/v1/chat/completions",
                              chat_body(old.model_id, max_tokens=400, ignore_eos=True))
        wait_until(lambda: old.stats()["running"] == 1, what="the request to start")
        old.close()  # the tray unloads the model before loading the next one
        cut = running.result()
    assert cut.status == 503 and cut.error["code"] == "model_unloaded"
    response = raw_request(handle, "POST", "/v1/chat/completions", chat_body(old.model_id, max_tokens=2))
    assert response.status == 503 and response.error["code"] == "model_loading"
    assert raw_request(handle, "GET", "/health").json()["state"] == "loading"
    current["engine"] = engine
    assert raw_request(handle, "POST", "/v1/chat/completions", chat_body(engine.model_id, max_tokens=2)).status == 200
