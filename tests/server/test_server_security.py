"""Host (DNS rebinding), Origin/CORS, API key, body size and bind-address checks."""

from __future__ import annotations

import http.client
import json

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
    chunked = raw_request(handle, "POST", "/v1/chat/completions", raw_body=b"5\r\n{}   \r\n0\r\n\r\n",
                          headers={"Transfer-Encoding": "chunked", "Content-Length": None})
    assert chunked.status == 411


def test_non_loopback_bind_needs_allow_remote():
    with pytest.raises(ServerConfigError, match="--allow-remote"):
        ServerConfig(host="0.0.0.0")
    with pytest.raises(ServerConfigError, match="--cors-origin"):
        ServerConfig(cors_origins=("localhost:3000",))
    assert ServerConfig(host="localhost").bind_host == "127.0.0.1"
    assert ServerConfig(host="0.0.0.0", allow_remote=True).bind_host == "0.0.0.0"
