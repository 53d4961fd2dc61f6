"""The tray app over the real engine (tiny random Qwen2 on CPU): the adapter, long text that
must fit a small context, one engine serving chat and the real local API together, and the API's key."""

from __future__ import annotations

import http.client
import json

import pytest
from ui_fakes import FakeHotkeys, RecordingInjector

from app.engine import Engine, SamplingParams
from app.engine.request import PRIORITY_INTERACTIVE
from app.ui.actions import load_builtin_actions
from app.ui.backend.local import LocalEngineBackend
from app.settings.store import SettingsStore
from app.ui.models import ModelEntry
from app.ui.pipeline import ActionPipeline, Sink
from app.settings.preferences import Preferences

SHORT_CONTEXT = 256


class SpyBackend(LocalEngineBackend):
    """The real adapter, recording the prompt size of every request it sends."""

    def __init__(self, engine):
        super().__init__(engine)
        self.prompt_tokens: list[int] = []

    def chat(self, messages, params, priority):
        self.prompt_tokens.append(self.count_chat_tokens(messages))
        return super().chat(messages, params, priority)


@pytest.fixture(scope="module")
def engine(tiny_qwen_dir):
    engine = Engine.load(tiny_qwen_dir, device="cpu", max_context=SHORT_CONTEXT, max_batch_size=2)
    yield engine
    engine.close()


def test_adapter_streams_and_counts_with_the_engine_tokenizer(engine):
    backend = LocalEngineBackend(engine)
    assert (backend.name, backend.device, backend.max_context) == (engine.model_id, "cpu", SHORT_CONTEXT)
    messages = [{"role": "user", "content": "Summarize: the meeting moved to Friday."}]
    assert backend.count_chat_tokens(messages) == len(engine.tokenizer.encode_chat(messages))
    assert backend.count_tokens("你好, world") == len(engine.tokenizer.encode("你好, world"))
    stream = backend.chat(messages, SamplingParams(max_tokens=8, temperature=0), PRIORITY_INTERACTIVE)
    deltas = list(stream)
    assert "".join(deltas) == stream.result.text and stream.result.usage.completion_tokens == 8
    again = backend.chat(messages, SamplingParams(max_tokens=8, temperature=0), PRIORITY_INTERACTIVE)
    assert again.text() == stream.result.text  # greedy: the same answer


def test_text_far_longer_than_the_context_is_map_reduced_within_it(engine):
    backend = SpyBackend(engine)
    summarize = next(a for a in load_builtin_actions() if a.id == "summarize")
    params = SamplingParams(max_tokens=24, temperature=0)
    text = "\n".join(f"Item {i}: the supplier delivered {i * 7} boxes on day {i}; two were damaged." for i in range(40))
    assert backend.count_tokens(text) > 3 * SHORT_CONTEXT
    deltas, steps = [], []
    result = ActionPipeline(backend, summarize, params, PRIORITY_INTERACTIVE).run(
        text, Sink(deltas.append, lambda stage, done, total: steps.append((done, total))))
    assert len(backend.prompt_tokens) >= 4  # several map requests and a combine
    assert all(n + params.max_tokens <= SHORT_CONTEXT for n in backend.prompt_tokens)  # the engine never refused
    assert "".join(deltas) == result.text
    assert steps[-1][0] == steps[-1][1] > 1


def test_one_engine_serves_chat_and_the_local_api(qtbot, tiny_qwen_dir):
    from PySide6.QtGui import QGuiApplication

    from app.ui.app import TrayApp

    with SettingsStore().edit() as settings:
        settings.add_model(ModelEntry("tiny", path=str(tiny_qwen_dir)))
        settings.preferences = Preferences(temperature=0)  # greedy chat, comparable with the API's answer
    app = TrayApp(hotkey_factory=FakeHotkeys, injector=RecordingInjector(QGuiApplication.clipboard(), None))
    try:
        with qtbot.waitSignal(app.host.loaded, timeout=60000):
            app.start()
        engine = app.host.backend.engine
        app.set_local_api(True)
        assert app.local_api.running, app.notices
        url = app.local_api.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        conn = http.client.HTTPConnection(url.split("//")[1].split("/")[0], timeout=60)
        conn.request("GET", "/v1/models")
        models = json.loads(conn.getresponse().read())
        assert [m["id"] for m in models["data"]] == [engine.model_id] == ["tiny"]  # the registered name
        body = {"model": engine.model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                "temperature": 0}
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["usage"]["completion_tokens"] == 5

        app.open_chat()
        window = app.chat_window
        window.input.setPlainText("hi")
        window.send_button.click()
        qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=60000)
        # Same greedy decoding; max_tokens differs (5 vs the chat's 512): one is a prefix of the other.
        chat_answer = window.conversation.messages[1].content
        api_answer = answer["choices"][0]["message"]["content"]
        assert chat_answer.startswith(api_answer) and len(api_answer) > 0
        assert app.host.backend.engine is engine  # one engine served both
        assert window.status.text().startswith("tiny · CPU"), window.status.text()  # not the folder's name
        app.set_local_api(False)
        assert not app.local_api.running
    finally:
        app.shutdown()
    assert engine.closed


def test_a_remote_model_stops_the_local_api_and_switching_back_starts_it_again(qtbot, tiny_qwen_dir):
    from PySide6.QtGui import QGuiApplication

    from app.ui.app import TrayApp

    local = ModelEntry("tiny", path=str(tiny_qwen_dir))
    remote = ModelEntry("Team server", kind="remote", base_url="http://127.0.0.1:9/v1", model="qwen2.5-7b")
    with SettingsStore().edit() as settings:
        settings.add_model(local)
        settings.add_model(remote)
        settings.preferences = Preferences(local_api_enabled=True, local_api_port=_free_port())
    app = TrayApp(hotkey_factory=FakeHotkeys, injector=RecordingInjector(QGuiApplication.clipboard(), None))
    try:
        with qtbot.waitSignal(app.host.loaded, timeout=60000):
            app.start()
        qtbot.waitUntil(lambda: app.local_api.running, timeout=10000)
        app.switch_model(remote)
        assert not app.local_api.running  # it serves the local engine only
        assert SettingsStore().load().preferences.local_api_enabled  # the user's choice is kept
        with qtbot.waitSignal(app.host.loaded, timeout=60000):
            app.switch_model(local)
        qtbot.waitUntil(lambda: app.local_api.running, timeout=10000)  # back on, without the user
    finally:
        app.shutdown()


def test_the_kept_api_key_guards_the_real_engine(qtbot, tiny_qwen_dir):
    """A key Settings keep (in the test keyring) is required from the start: 401 without it, the
    answer with it (the engine is loaded: 200, not the 503 of a model still loading)."""
    from PySide6.QtGui import QGuiApplication

    from app import secrets
    from app.ui.app import TrayApp

    secrets.set_local_api_key("tray-key")
    port = _free_port()
    with SettingsStore().edit() as settings:
        settings.add_model(ModelEntry("tiny", path=str(tiny_qwen_dir)))
        settings.preferences = Preferences(local_api_enabled=True, local_api_port=port)
    app = TrayApp(hotkey_factory=FakeHotkeys, injector=RecordingInjector(QGuiApplication.clipboard(), None))
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        with qtbot.waitSignal(app.host.loaded, timeout=60000):
            app.start()
        qtbot.waitUntil(lambda: app.local_api.running, timeout=10000)
        for authorization, status in ((None, 401), ("Bearer wrong", 401), ("Bearer tray-key", 200)):
            headers = {"Content-Type": "application/json"}
            if authorization:
                headers["Authorization"] = authorization
            conn.request("POST", "/v1/chat/completions", body, headers)
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == status, answer
        assert answer["usage"]["completion_tokens"] == 2
    finally:
        conn.close()
        app.shutdown()


def test_the_chat_over_the_real_engine_fits_its_context_and_refuses_what_never_could(qtbot, tiny_qwen_dir):
    """Qwen's real chat template and tokenizer: whole turns are left out, every request leaves the
    answer its room (the engine never refuses one), and a paste past the context is refused."""
    from app.ui.controllers.engine_host import EngineHost
    from app.ui.preferences import PreferencesStore
    from app.ui.widgets.chat import ChatWindow

    backend = SpyBackend(Engine.load(tiny_qwen_dir, device="cpu", max_context=SHORT_CONTEXT, max_batch_size=2))
    host = EngineHost(lambda entry, progress=None: backend)
    with qtbot.waitSignal(host.loaded, timeout=60000):
        host.switch_to(ModelEntry("tiny", path=str(tiny_qwen_dir)))
    store = PreferencesStore()
    store.update(max_tokens=24, temperature=0)
    window = ChatWindow(host, store)
    qtbot.addWidget(window)
    try:
        for i in range(7):
            window.input.setPlainText(f"Question {i}: when did the supplier deliver the boxes?")
            window.send_button.click()
            qtbot.waitUntil(lambda: window.task is None, timeout=60000)
            assert "Error" not in window.status.text(), window.status.text()
        budget = SHORT_CONTEXT - 24
        assert all(n <= budget for n in backend.prompt_tokens)  # the engine never refused one
        assert max(backend.prompt_tokens) > budget - 60  # (turns of about 50 tokens: none left out needlessly)
        assert "left out to fit the model's context" in window.scroll.notes()[-1]
        window.input.setPlainText("word " * 400)
        window.send_button.click()
        assert window.status.text().startswith("This message is too long for the model's context (")
        assert len(backend.prompt_tokens) == 7 and window.input.toPlainText() == "word " * 400  # not sent
    finally:
        host.shutdown()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
