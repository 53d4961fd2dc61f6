"""The inputs that once gave a 500 or no answer at all (issue 33), each answered with OpenAI's 4xx."""

from __future__ import annotations

import logging
import select
import socket

import pytest

from server_helpers import chat_body, raw_request


def _post(server, raw: bytes, path: str = "/v1/chat/completions"):
    return raw_request(server, "POST", path, raw_body=raw)


@pytest.mark.parametrize("role", [["user"], {"a": 1}, 5, None])
def test_role_of_any_type_is_a_400_naming_it(server, engine, role):
    body = chat_body(engine.model_id, max_tokens=2)
    body["messages"][0]["role"] = role
    response = raw_request(server, "POST", "/v1/chat/completions", body)
    assert response.status == 400
    assert response.error["param"] == "messages[0].role"


@pytest.mark.parametrize("raw", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"model": "m", "messages": [], "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"model": "m", "temperature": NaN}',
], ids=["nested-100k", "nested-field", "5000-digits", "nan"])
def test_json_no_parser_should_take_is_a_400(server, raw):
    response = _post(server, raw)
    assert response.status == 400
    assert response.error["code"] == "invalid_json" and response.error["message"].startswith("Request body is not")


def test_huge_integer_in_a_float_field_is_a_400(server, engine):
    response = raw_request(server, "POST", "/v1/chat/completions", chat_body(engine.model_id, temperature=10**400))
    assert response.status == 400 and response.error["param"] == "temperature"


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "M", "messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (b'{"model": "M", "\\udfff": 1, "messages": [{"role": "user", "content": "hi"}]}', "\\udfff"),
    (b'{"model": "M", "stop": ["\\udc00"], "messages": [{"role": "user", "content": "hi"}]}', "stop[0]"),
])
def test_lone_surrogates_are_a_400_naming_where(server, engine, raw, param):
    response = _post(server, raw.replace(b'"M"', b'"' + engine.model_id.encode() + b'"'))
    assert response.status == 400
    assert response.error["param"] == param and "lone surrogate" in response.error["message"]
    assert response.body.isascii()  # escaped: the body is valid UTF-8 JSON whatever the client sent


def test_a_valid_surrogate_pair_is_just_text(server, engine):
    raw = b'{"model": "M", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    assert _post(server, raw.replace(b'"M"', b'"' + engine.model_id.encode() + b'"')).status == 200


def test_control_characters(server, engine):
    escaped = chat_body(engine.model_id, content="a\u0000b\u001fc\u007f", max_tokens=2)
    assert raw_request(server, "POST", "/v1/chat/completions", escaped).status == 200
    assert raw_request(server, "POST", "/v1/chat/completions", chat_body("a\u0000b")).status == 404
    raw = b'{"model": "m\x01", "messages": []}'  # unescaped control characters are not JSON
    assert _post(server, raw).error["code"] == "invalid_json"


def _exchange(server, data: bytes) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(("request_head", "status", "code"), [
    (b"GARBAGE\r\n\r\n", 400, "invalid_http_request"),
    (b"GET /health\r\n\r\n", 400, "invalid_http_request"),  # HTTP/0.9 style: no version
    (b"GET /h\xffx HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "invalid_http_request"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n", 400, "invalid_http_request"),
    (b"GET /health HTTP/2.0\r\nHost: localhost\r\n\r\n", 505, "http_version_not_supported"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "http_version_not_supported"),  # an HTTP/2 preface
])
def test_malformed_requests_get_a_status_line_and_json(server, request_head, status, code):
    answer = _exchange(server, request_head)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    assert b"content-type: application/json" in head.lower() and b"connection: close" in head.lower()
    assert f'"code": "{code}"'.encode() in body
    assert b"bytearray" not in body and b"b'" not in body  # h11's reason, without its Python repr


def test_a_malformed_chunked_body_is_one_400_and_no_traceback_in_the_log(server, caplog):
    """h11 answers the bad chunk header itself; the route, already running for the head, must not
    answer again on the errored connection (that was "Exception in ASGI application")."""
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\nzz\r\n")
    with caplog.at_level(logging.DEBUG):
        answers = [_exchange(server, request) for _ in range(5)]
        assert raw_request(server, "GET", "/health").status == 200  # (and the route has run by now)
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 400 ") and b'"code": "invalid_http_request"' in answer
        assert answer.count(b"HTTP/1.1 ") == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


def test_oversized_request_head_is_431(server):
    head = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: "
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(head)
        for _ in range(64):  # 1 KiB pieces, more than an incomplete head may hold, until it answers
            sock.sendall(b"a" * 1024)
            if select.select([sock], [], [], 0.05)[0]:
                break
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 431 ") and b'"code": "request_header_too_large"' in answer


# -- limits that were silently ignored --------------------------------------------------------------
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_past_the_window_is_a_400_naming_the_field(server, engine, field):
    response = raw_request(server, "POST", "/v1/chat/completions", chat_body(engine.model_id, **{field: 10**9}))
    assert response.status == 400
    assert response.error["param"] == field and response.error["code"] == "invalid_value"
    assert f"at most {engine.max_context - 1} completion tokens" in response.error["message"]


def test_answer_stops_where_the_window_ends(server, engine):
    """A max_tokens the window can hold, but not beside this prompt: the answer ends at the window."""
    messages = [{"role": "user", "content": "Hello"}]
    room = engine.max_context - len(engine.tokenizer.encode_chat(messages))
    response = raw_request(server, "POST", "/v1/chat/completions",
                           {"model": engine.model_id, "messages": messages, "max_tokens": room + 5, "ignore_eos": True})
    assert response.status == 200
    assert response.json()["usage"]["completion_tokens"] == room
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_a_prompt_that_fills_the_window_is_context_length_exceeded(server, engine):
    ids = [engine.tokenizer.encode("word")[0]] * engine.max_context
    response = raw_request(server, "POST", "/v1/completions", {"model": engine.model_id, "prompt": ids})
    assert response.status == 400 and response.error["code"] == "context_length_exceeded"
    assert response.error["param"] == "prompt"
    assert response.error["message"].startswith(
        f"This model's maximum context length is {engine.max_context} tokens. However, your prompt resulted in "
        f"{engine.max_context} tokens, which leaves no room for the completion.")


def test_completion_default_is_cut_to_the_room_left(server, engine):
    """/v1/completions defaults to 16 tokens; a prompt that leaves fewer gets what fits, not a 400."""
    ids = [engine.tokenizer.encode("word")[0]] * (engine.max_context - 3)
    response = raw_request(server, "POST", "/v1/completions",
                           {"model": engine.model_id, "prompt": ids, "ignore_eos": True})
    assert response.status == 200 and response.json()["usage"]["completion_tokens"] == 3
