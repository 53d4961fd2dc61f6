"""Many clients at once, clients that hang up, a full queue, and stopping under load."""

from __future__ import annotations

import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor

from app.engine import SamplingParams
from server_helpers import raw_request, wait_until


def _prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Request number {i}: say something about the number {i * 7}."}]


def _max_tokens(i: int) -> int:
    return 3 + i % 9  # different lengths: requests finish and join at different steps


def test_32_concurrent_streams_over_4_slots_match_sequential(client, engine):
    sequential = []
    for i in range(32):
        result = engine.chat(_prompt(i), SamplingParams(max_tokens=_max_tokens(i), temperature=0)).result
        sequential.append((result.text, result.finish_reason, result.usage.completion_tokens))

    def stream(i: int):
        chunks = list(client.chat.completions.create(
            model=engine.model_id, messages=_prompt(i), max_tokens=_max_tokens(i), temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        return text, finish, chunks[-1].usage.completion_tokens, {c.id for c in chunks}

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(stream, range(32)))

    ids = set()
    for i, (text, finish, completion_tokens, chunk_ids) in enumerate(results):
        assert (text, finish[0], completion_tokens) == sequential[i], f"request {i} differs from its sequential run"
        assert len(finish) == 1 and len(chunk_ids) == 1
        ids |= chunk_ids
    assert len(ids) == 32  # every response has its own id: none lost or duplicated
    wait_until(lambda: engine.stats()["running"] == 0, what="all slots free")


class OpenRequest:
    """A long generation on its own connection (after its first event if streaming)."""

    def __init__(self, handle, engine, stream: bool = True, max_tokens: int = 400):
        self.conn = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
        body = {"model": engine.model_id, "messages": _prompt(0), "max_tokens": max_tokens, "stream": stream,
                "ignore_eos": True}
        self.conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.sock = self.conn.sock
        self.response = None
        if stream:
            self.response = self.conn.getresponse()
            assert self.response.status == 200
            assert self.response.readline().startswith(b"data: ")  # it holds a slot now

    def hang_up(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def test_disconnect_mid_stream_cancels_and_frees_the_slot(make_server, engine):
    handle = make_server()
    request = OpenRequest(handle, engine)
    assert engine.stats()["running"] == 1
    request.hang_up()
    wait_until(lambda: handle.stats()["active"] == 0, what="the server to drop the request")
    assert handle.stats()["disconnects"] == 1  # finished as "cancelled", not by running to max_tokens
    assert engine.stats()["running"] == 0


def test_disconnect_while_waiting_for_a_non_streaming_answer_cancels(make_server, engine):
    handle = make_server()
    request = OpenRequest(handle, engine, stream=False)
    wait_until(lambda: handle.stats()["active"] == 1 and engine.stats()["running"] == 1, what="the request to start")
    request.hang_up()
    wait_until(lambda: handle.stats()["active"] == 0, what="the server to drop the request")
    assert handle.stats()["disconnects"] == 1
    assert engine.stats()["running"] == 0


def test_full_queue_answers_429_with_retry_after(make_server, engine):
    handle = make_server(max_queued=0)  # only the 4 slots; nothing may wait
    requests = [OpenRequest(handle, engine) for _ in range(engine.max_batch_size)]
    try:
        response = raw_request(handle, "POST", "/v1/chat/completions",
                               {"model": engine.model_id, "messages": _prompt(1), "max_tokens": 2})
        assert response.status == 429
        assert response.headers["retry-after"] == "1"
        assert response.error["code"] == "rate_limit_exceeded"
    finally:
        for request in requests:
            request.hang_up()
    wait_until(lambda: handle.stats()["active"] == 0 and engine.stats()["running"] == 0, what="slots to free")
    assert raw_request(handle, "POST", "/v1/chat/completions",
                       {"model": engine.model_id, "messages": _prompt(1), "max_tokens": 2}).status == 200


def test_stop_ends_running_streams_and_frees_the_port(make_server, engine):
    handle = make_server()
    request = OpenRequest(handle, engine)
    idle = http.client.HTTPConnection(handle.host, handle.port, timeout=30)  # an idle keep-alive connection
    idle.request("GET", "/health")
    assert idle.getresponse().read()
    handle.stop()
    rest = request.response.read()
    events = [line for line in rest.split(b"\n") if line.startswith(b"data: {")]
    assert json.loads(events[-1][len(b"data: "):])["error"]["code"] == "server_shutting_down"
    assert b"[DONE]" not in rest
    assert handle.stats() == {"active": 0, "admitted": 0, "connections": 0, "disconnects": 0}
    assert engine.stats()["running"] == 0
    again = make_server(port=handle.port)  # the port is free for a restart (tray: Local API off/on)
    assert raw_request(again, "GET", "/health").json()["state"] == "ready"


def test_disconnect_while_queued_frees_its_place(make_server, engine):
    """A request still waiting for a slot whose client leaves is counted out at once, streaming or not."""
    handle = make_server()
    running = [OpenRequest(handle, engine) for _ in range(engine.max_batch_size)]
    try:
        for stream in (True, False):
            queued = http.client.HTTPConnection(handle.host, handle.port, timeout=30)
            body = {"model": engine.model_id, "messages": _prompt(2), "max_tokens": 5, "stream": stream}
            queued.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
            wait_until(lambda: engine.stats()["waiting"] == 1, what="the request to queue")
            queued.sock.shutdown(socket.SHUT_RDWR)
            queued.close()
            wait_until(lambda: handle.stats()["admitted"] == engine.max_batch_size and engine.stats()["waiting"] == 0,
                       what="the queued request to be counted out")
            assert handle.stats()["active"] == engine.max_batch_size
    finally:
        for request in running:
            request.hang_up()
    wait_until(lambda: handle.stats()["active"] == 0 and handle.stats()["admitted"] == 0, what="all counted out")
    assert handle.stats()["disconnects"] == engine.max_batch_size + 2
