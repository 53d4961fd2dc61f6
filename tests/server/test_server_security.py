"""Host (DNS rebinding), Origin/CORS, API key, body size and bind-address checks."""

from __future__ import annotations

import http.client
import json
import select
import socket

import pytest

from app.server import ServerConfig, ServerConfigError, start_server_in_thread
from app.server.security import host_allowed, host_name
from server_helpers import chat_body, raw_request


@pytest.mark.parametrize("host", ["evil.example", "evil.example:18000", "127.0.0.1.nip.io", "192.168.1.5"])
def test_foreign_host_header_is_refused(server, host):
    response = raw_request(server, "GET", "/v1/models", headers={"Host": host})
    assert response.status == 403
    assert response.error["code"] == "host_not_allowed"


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:1234", "127.0.0.1", "127.0.0.1:18000", "[::1]:18000"])
def test_loopback_host_headers_are_accepted(server, host):
    assert raw_request(server, "GET", "/v1/models", headers={"Host": host}).status == 200


def test_missing_host_header_is_refused(server):
    response = raw_request(server, "GET", "/v1/models", skip_host=True)
    assert response.status == 400 and response.error["code"] == "missing_host"


def test_host_rules():
    assert host_name("[::1]:80") == "[::1]" and host_name("Example.COM.:80") == "example.com"
    lan = ServerConfig(host="0.0.0.0", allow_remote=True, allowed_hosts=("mybox.lan",))
    assert host_allowed("192.168.1.5:18000", lan) and host_allowed("mybox.lan", lan)
    assert not host_allowed("evil.example", lan)
    bound = ServerConfig(host="10.0.0.2", allow_remote=True)
    assert host_allowed("10.0.0.2:18000", bound) and not host_allowed("10.0.0.3", bound)


def test_cross_site_request_without_allowed_origin_is_refused(server, engine):
    # A "simple" POST from a web page (no preflight): refused before anything runs.
    response = raw_request(server, "POST", "/v1/chat/completions", chat_body(engine.model_id),
                           headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert response.status == 403 and response.error["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in response.headers
    preflight = raw_request(server, "OPTIONS", "/v1/chat/completions",
                            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert preflight.status == 403 and "access-control-allow-origin" not in preflight.headers


def test_allowed_origin_gets_cors_headers(make_server, engine):
    origin = "http://localhost:3000"
    handle = make_server(cors_origins=(origin,))
    preflight = raw_request(handle, "OPTIONS", "/v1/chat/completions",
                            headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Private-Network": "true"})
    assert preflight.status == 204
    assert preflight.headers["access-control-allow-origin"] == origin
    assert "Authorization" in preflight.headers["access-control-allow-headers"]
    assert preflight.headers["access-control-allow-private-network"] == "true"
    response = raw_request(handle, "POST", "/v1/chat/completions", chat_body(engine.model_id, max_tokens=2),
                           headers={"Origin": origin})
    assert response.status == 200 and response.headers["access-control-allow-origin"] == origin
    stream = raw_request(handle, "POST", "/v1/chat/completions",
                         chat_body(engine.model_id, max_tokens=2, stream=True), headers={"Origin": origin})
    assert stream.headers["access-control-allow-origin"] == origin
    assert raw_request(handle, "GET", "/v1/models", headers={"Origin": "http://localhost:4000"}).status == 403


# What the official openai JS SDK (v4+) sends from a browser: its X-Stainless-* headers besides the usual two.
SDK_HEADERS = "authorization,content-type,x-stainless-os,x-stainless-lang,x-stainless-retry-count,x-stainless-timeout"


def test_preflight_allows_the_headers_an_allowed_page_asks_for(make_server, engine):
    origin = "http://localhost:3000"
    handle = make_server(cors_origins=(origin,))
    preflight = raw_request(handle, "OPTIONS", "/v1/chat/completions",
                            headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": SDK_HEADERS})
    assert preflight.status == 204
    allowed = {name.strip().lower() for name in preflight.headers["access-control-allow-headers"].split(",")}
    assert allowed >= set(SDK_HEADERS.split(","))
    vary = {name.strip().lower() for name in preflight.headers["vary"].split(",")}
    assert {"origin", "access-control-request-headers"} <= vary
    # only header-name tokens are echoed: no way to smuggle text into the answer's headers
    odd = raw_request(handle, "OPTIONS", "/v1/chat/completions",
                      headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                               "Access-Control-Request-Headers": "x-ok, bad name, x(y), , content-type"})
    assert odd.headers["access-control-allow-headers"] == "x-ok, content-type"
    # a request with an allowed origin, and one without (curl), say that the answer depends on Origin
    stream_headers = {"Origin": origin, "X-Stainless-Lang": "js"}
    answer = raw_request(handle, "POST", "/v1/chat/completions", chat_body(engine.model_id, max_tokens=2),
                         headers=stream_headers)
    assert answer.status == 200 and answer.headers["vary"] == "Origin"
    assert raw_request(handle, "GET", "/v1/models").headers["vary"] == "Origin"


def test_preflight_from_a_disallowed_origin_is_still_refused(make_server):
    handle = make_server(cors_origins=("http://localhost:3000",))
    preflight = raw_request(handle, "OPTIONS", "/v1/chat/completions",
                            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": SDK_HEADERS})
    assert preflight.status == 403 and preflight.error["code"] == "origin_not_allowed"
    assert not any(name.startswith("access-control-") for name in preflight.headers)


def test_origin_null_gets_advice_the_server_takes(server):
    """file:// pages and sandboxed frames send "Origin: null". The 403 suggested --cors-origin null,
    which the CLI then refused; any site can send null from a sandboxed frame, so it stays refused
    and both say so, the same way."""
    response = raw_request(server, "GET", "/v1/models", headers={"Origin": "null"})
    assert response.status == 403 and response.error["code"] == "origin_not_allowed"
    message = response.error["message"]
    assert "--cors-origin null " not in message and "serve the page from an http:// origin" in message
    with pytest.raises(ServerConfigError) as info:
        ServerConfig(cors_origins=("null",))
    assert str(info.value) == ("--cors-origin 'null' cannot be allowed: any web site can send it from a sandboxed "
                               "frame (file:// pages send it too); serve the page from an http:// origin and allow "
                               "that origin")
    assert message == f"Origin 'null' is not allowed, and {info.value}."
    origin = "http://localhost:3000"  # an origin the option takes is still suggested as before
    suggested = raw_request(server, "GET", "/v1/models", headers={"Origin": origin}).error["message"]
    assert f"start the server with --cors-origin {origin} " in suggested
    assert ServerConfig(cors_origins=(origin,)).cors_origins == (origin,)


def test_api_key_is_required_when_set(make_server, engine):
    import openai

    handle = make_server(api_key="s3cret")
    missing = raw_request(handle, "GET", "/v1/models")
    assert missing.status == 401 and missing.error["code"] == "invalid_api_key"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = raw_request(handle, "GET", "/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401
    basic = raw_request(handle, "GET", "/v1/models", headers={"Authorization": "Basic s3cret"})
    assert basic.status == 401
    assert raw_request(handle, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"}).status == 200
    assert raw_request(handle, "GET", "/health").status == 200  # liveness stays open
    good = openai.OpenAI(base_url=handle.base_url, api_key="s3cret", max_retries=0)
    assert good.chat.completions.create(model=engine.model_id, messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=2).choices
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=handle.base_url, api_key="bad", max_retries=0).models.list()


def test_a_changed_api_key_applies_at_once_on_open_connections_too():
    """The tray changes its Local API's key without a restart (ServerHandle.set_api_key): the
    next request needs the new key, one on a keep-alive connection opened before included."""
    handle = start_server_in_thread(lambda: None, port=0)  # nothing loaded: a passed check answers 503
    conn = http.client.HTTPConnection(handle.host, handle.port, timeout=30)

    def models(authorization: str | None = None) -> tuple[int, str]:
        conn.request("GET", "/v1/models", headers={"Authorization": authorization} if authorization else {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())["error"]["code"]

    try:
        assert models() == (503, "model_loading")
        handle.set_api_key("new-key")
        assert models() == (401, "invalid_api_key")  # the same connection, now refused
        assert models("Bearer new-key") == (503, "model_loading")
        handle.set_api_key("")  # no key any more
        assert models() == (503, "model_loading")
    finally:
        conn.close()
        handle.stop()


def test_body_size_limit_and_length_required(make_server, engine):
    handle = make_server(max_body_bytes=2048)
    big = chat_body(engine.model_id, content="x" * 4096)
    response = raw_request(handle, "POST", "/v1/chat/completions", big)
    assert response.status == 413 and response.error["code"] == "request_too_large"
    assert "2048" in response.error["message"]
    assert response.headers["connection"] == "close"  # the unread body cannot be reused as a request
    no_length = raw_request(handle, "POST", "/v1/chat/completions", headers={"Content-Length": None})
    assert no_length.status == 411 and no_length.error["code"] == "length_required"


def test_a_chunked_body_is_read(server, engine):
    """HTTP/1.1 servers must take chunked bodies (RFC 9112 7.1): .NET's JsonContent, Java's
    ofInputStream and python-requests with an iterable send them. They got 411."""
    body = json.dumps(chat_body(engine.model_id, max_tokens=2)).encode()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:  # an iterable body without a length: http.client sends it chunked, one chunk per piece
        conn.request("POST", "/v1/chat/completions", body=iter([body[:10], body[10:]]),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 200, answer
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] >= 1


def _chunked_head(path: str = "/v1/chat/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()


def test_a_chunked_body_past_the_limit_is_413_before_it_ends(make_server):
    """The limit holds without a Content-Length: counted as the chunks arrive, answered as soon as
    it is passed, and the connection is closed (the rest of the body is never read)."""
    handle = make_server(max_body_bytes=2048)
    chunk = b"400\r\n" + b" " * 1024 + b"\r\n"
    with socket.create_connection((handle.host, handle.port), timeout=30) as sock:
        sock.sendall(_chunked_head())
        for sent in range(1, 65):  # up to 64 KiB; once past the limit, wait for the answer first
            sock.sendall(chunk)
            if select.select([sock], [], [], 10.0 if sent * 1024 > 2048 else 0.0)[0]:
                break
        answer = b"".join(iter(lambda: sock.recv(65536), b""))  # to the end: the server closes
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"] == {"message": "Request body is over the limit of 2048 bytes.",
                                         "type": "invalid_request_error", "param": None, "code": "request_too_large"}
    assert sent == 3  # answered at the chunk that passed the limit, not after the whole body


def test_a_chunked_body_that_stops_arriving_gets_408(make_server):
    handle = make_server(request_timeout_s=0.5)
    with socket.create_connection((handle.host, handle.port), timeout=30) as sock:
        sock.sendall(_chunked_head() + b"9\r\n{\"model\":\r\n")  # and never the last chunk
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_non_loopback_bind_needs_allow_remote():
    with pytest.raises(ServerConfigError, match="--allow-remote"):
        ServerConfig(host="0.0.0.0")
    with pytest.raises(ServerConfigError, match="--cors-origin"):
        ServerConfig(cors_origins=("localhost:3000",))
    assert ServerConfig(host="localhost").bind_host == "127.0.0.1"
    assert ServerConfig(host="0.0.0.0", allow_remote=True).bind_host == "0.0.0.0"
