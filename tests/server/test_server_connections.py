"""Connections that never finish a request are closed; answers, however long, are never cut."""

from __future__ import annotations

import http.client
import json
import select
import socket
import time

from server_helpers import chat_body, wait_until


def _closed_by_server(sock: socket.socket, trickle: bytes = b"", guard_s: float = 30.0) -> bool:
    """Send ``trickle`` one byte at a time (or nothing) until the server closes; False on the guard."""
    deadline = time.monotonic() + guard_s
    sent = 0
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            try:
                return sock.recv(4096) == b""
            except ConnectionResetError:
                return True
        if sent < len(trickle):
            try:
                sock.send(trickle[sent:sent + 1])
            except OSError:  # closed under us
                return True
            sent += 1
    return False


def test_idle_and_trickling_connections_are_closed_at_the_head_deadline(make_server):
    handle = make_server(request_timeout_s=0.5)
    idle = socket.create_connection((handle.host, handle.port))
    trickling = socket.create_connection((handle.host, handle.port))
    with idle, trickling:
        assert _closed_by_server(idle)
        assert _closed_by_server(trickling, b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 10_000)
    conn = http.client.HTTPConnection(handle.host, handle.port, timeout=30)  # a prompt client is served
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200


def test_a_body_that_does_not_arrive_gets_408(make_server, engine):
    handle = make_server(request_timeout_s=0.5)
    with socket.create_connection((handle.host, handle.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\":")
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_a_long_answer_outlives_the_request_deadline(make_server, engine):
    handle = make_server(request_timeout_s=0.3, keep_alive_s=0.3)
    conn = http.client.HTTPConnection(handle.host, handle.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", json.dumps(chat_body(engine.model_id, max_tokens=400,
                                                                      ignore_eos=True, stream=True)),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    events = [line for line in response.read().split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert sum(bool(c["choices"][0]["delta"].get("content")) for c in chunks) > 0
    conn.request("GET", "/health")  # the same keep-alive connection, right after the answer
    assert conn.getresponse().status == 200


def test_idle_keep_alive_connection_is_closed_after_keep_alive(make_server):
    handle = make_server(keep_alive_s=0.3)
    with socket.create_connection((handle.host, handle.port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 200 ")
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        assert json.loads(reader.read(length))["state"] == "ready"
        assert _closed_by_server(sock)
    wait_until(lambda: handle.stats()["connections"] == 0, what="the server to forget the connection")
