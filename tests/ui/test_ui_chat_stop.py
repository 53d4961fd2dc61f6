"""The chat window when an answer does not end by itself: quitting mid-answer, Stop right after
Send or while an idle-unloaded model loads again, a model switch mid-answer, Stop before the
first token; and the keys: Tab moves on, Esc stops."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication
from ui_fakes import FakeBackend, FakeHotkeys, FakeOpener, FakeStream, RecordingInjector, TokenGate

from app.errors import EngineClosedError
from app.ui.controllers.engine_host import EngineHost
from app.ui.history import ChatHistory
from app.ui.i18n import set_language
from app.ui.models import ModelEntry
from app.ui.preferences import PreferencesStore
from app.ui.widgets.chat import ChatWindow

ANSWER = "one two three four five six seven eight"


def _loaded_host(qtbot, opener) -> EngineHost:
    host = EngineHost(opener)
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(ModelEntry("fake", path="/fake"))
    return host


@pytest.fixture
def host(qtbot):
    host = _loaded_host(qtbot, FakeOpener(answer=lambda m: ANSWER))
    yield host
    host.shutdown()


def _window(qtbot, host) -> ChatWindow:
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    return window


def _saved() -> list[tuple[str, str, str]]:
    conversation, = ChatHistory().load_all()[0]
    return [(m.role, m.content, m.finish) for m in conversation.messages]


def _stream_partly(qtbot, window, gate, text, tokens) -> str:
    window.input.setPlainText(text)
    window.send_button.click()
    gate.release(tokens)
    partial = "".join(word + " " for word in ANSWER.split(" ")[:tokens])
    qtbot.waitUntil(lambda: window.message_widgets()[-1].text() == partial, timeout=5000)
    return partial


def _tray(qtbot):
    from app.ui.app import TrayApp

    app = TrayApp(opener=FakeOpener(answer=lambda m: ANSWER), hotkey_factory=FakeHotkeys,
                  injector=RecordingInjector(QGuiApplication.clipboard(), None), with_tray_icon=False)
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()
    return app


def test_quitting_while_an_answer_is_written_keeps_the_question_and_the_partial_answer(qtbot):
    app = _tray(qtbot)
    app.open_chat()
    window = app.chat_window
    gate = app.host.backend.gate = TokenGate()
    window.input.setPlainText("Write a long story")
    window.send_button.click()
    assert _saved() == [("user", "Write a long story", "")]  # kept from the moment it is sent
    gate.release(2)
    qtbot.waitUntil(lambda: window.message_widgets()[-1].text() == "one two ", timeout=5000)
    app.shutdown()  # what Quit, SIGTERM and --replace do
    assert _saved() == [("user", "Write a long story", ""), ("assistant", "one two ", "stopped")]


def test_stop_right_after_send_stops_the_answer_before_the_model_takes_it(qtbot, host):
    backend, release, streams = host.backend, threading.Event(), []
    real_chat = backend.chat

    def slow_chat(messages, params, priority):  # the tokenizing of a long prompt
        release.wait(10)
        streams.append(real_chat(messages, params, priority))
        return streams[-1]

    backend.chat = slow_chat
    window = _window(qtbot, host)
    window.input.setPlainText("Tell me a story")
    window.send_button.click()
    window.stop_button.click()
    assert window.task is None and window.send_button.isEnabled()  # free at once: nothing to wait for
    assert window.status.text() == "fake · CPU — Stopped" and window.scroll.notes() == ["Stopped"]
    release.set()
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert (streams[0].result.text, streams[0].result.finish_reason) == ("", "cancelled")  # the model wrote nothing
    assert [w.role for w in window.message_widgets()] == ["user"] and _saved() == [("user", "Tell me a story", "")]


class IdleUnloadingBackend(FakeBackend):
    """Gives its model back (``unload()``) and loads it again for the next request, held at
    ``reload_gate``, telling the host as ReloadingEngine does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.on_state, self.loaded, self.reload_gate = None, True, threading.Event()

    def set_idle_unload(self, seconds, on_state) -> None:
        self.on_state = on_state

    def unload(self) -> None:
        self.loaded = False
        self.on_state("unloaded")

    def chat(self, messages, params, priority):
        if not self.loaded:
            self.on_state("loading")
            self.reload_gate.wait(10)
            self.loaded = True
            self.on_state("ready")
        return super().chat(messages, params, priority)


def test_while_an_unloaded_model_loads_again_the_chat_says_so_and_stop_stops(qtbot):
    host = _loaded_host(qtbot, lambda entry, progress=None: IdleUnloadingBackend(name=entry.name))
    backend = host.backend
    backend.unload()
    qtbot.waitUntil(lambda: host.state == "unloaded", timeout=5000)
    window = _window(qtbot, host)
    assert window.status.text() == "fake unloaded to free memory; it loads again when needed"
    window.input.setPlainText("hi")
    window.send_button.click()
    qtbot.waitUntil(lambda: window.status.text() == "Loading fake…", timeout=5000)  # not "Writing…"
    window.stop_button.click()
    assert window.task is None and window.send_button.isEnabled() and window.scroll.notes() == ["Stopped"]
    backend.reload_gate.set()
    qtbot.waitUntil(lambda: not host.busy and host.state == "ready", timeout=5000)
    qtbot.wait(50)  # anything the stopped task still had queued
    assert [w.role for w in window.message_widgets()] == ["user"] and _saved() == [("user", "hi", "")]
    host.shutdown()


class EngineClosingStream(FakeStream):
    """A stream of an engine that a model switch closes: it fails with EngineClosedError once its
    backend is closed, before the cancel reaches it (the engine's scheduler is slower)."""

    def __init__(self, backend, pieces, gate):
        super().__init__(pieces, gate, 0)
        self._backend = backend

    def cancel(self) -> None:
        pass

    def __iter__(self):
        for piece in self._pieces:
            while not self._gate.wait(0.01):
                if self._backend.closed:
                    raise EngineClosedError("the engine was shut down before the request finished")
            yield piece


class SwitchedAwayBackend(FakeBackend):
    def chat(self, messages, params, priority):
        self.requests.append((messages, params, priority))
        return EngineClosingStream(self, [w + " " for w in ANSWER.split(" ")], self.gate)


def test_switching_model_mid_answer_keeps_the_partial_answer_as_stopped_in_the_ui_language(qtbot):
    set_language("zh_CN")
    host = _loaded_host(qtbot, lambda entry, progress=None: SwitchedAwayBackend(name=entry.name))
    gate = host.backend.gate = TokenGate()
    window = _window(qtbot, host)
    partial = _stream_partly(qtbot, window, gate, "Explain photosynthesis", 3)
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(ModelEntry("Smol-B", path="/b"))  # the tray's Model menu
    qtbot.waitUntil(lambda: window.task is None, timeout=5000)
    assert window.message_widgets()[-1].text() == partial  # not replaced by an error
    assert window.scroll.notes() == ["已停止"] and window.status.text().endswith("已停止")
    assert "错误" not in window.status.text() and "engine" not in window.status.text()
    assert _saved() == [("user", "Explain photosynthesis", ""), ("assistant", partial, "stopped")]
    host.shutdown()


def test_stop_before_the_first_token_keeps_no_empty_answer_and_sends_none_back(qtbot, host):
    gate = host.backend.gate = TokenGate()
    window = _window(qtbot, host)
    window.input.setPlainText("A very long prompt")
    window.send_button.click()
    qtbot.waitUntil(lambda: len(host.backend.requests) == 1, timeout=5000)  # the model is reading it
    window.stop_button.click()
    qtbot.waitUntil(lambda: window.task is None, timeout=5000)
    assert [w.role for w in window.message_widgets()] == ["user"] and window.scroll.notes() == ["Stopped"]
    assert [m.role for m in window.conversation.messages] == ["user"]
    assert _saved() == [("user", "A very long prompt", "")]
    gate.release(100)
    window.input.setPlainText("Shorter then")
    window.send_button.click()
    qtbot.waitUntil(lambda: window.task is None and len(host.backend.requests) == 2, timeout=5000)
    assert [m["role"] for m in host.backend.requests[1][0]] == ["user", "user"]


def test_tab_moves_the_focus_on_instead_of_typing_a_tab(qtbot, host):
    window = _window(qtbot, host)
    window.show()
    qtbot.waitUntil(window.input.hasFocus, timeout=5000)
    qtbot.keyClicks(window.input, "line1")
    qtbot.keyClick(window.input, Qt.Key_Tab)
    assert window.input.toPlainText() == "line1" and QApplication.focusWidget() is not window.input


def test_esc_stops_the_answer_and_otherwise_changes_nothing(qtbot, host):
    window = _window(qtbot, host)
    window.show()
    qtbot.waitUntil(window.input.hasFocus, timeout=5000)
    qtbot.keyClicks(window.input, "draft")
    qtbot.keyClick(window.input, Qt.Key_Escape)  # nothing running: the draft stays
    assert window.input.toPlainText() == "draft" and window.isVisible() and window.message_widgets() == []
    window.input.clear()
    gate = host.backend.gate = TokenGate()
    partial = _stream_partly(qtbot, window, gate, "Count", 2)
    qtbot.keyClick(window.input, Qt.Key_Escape)
    qtbot.waitUntil(lambda: window.task is None, timeout=5000)
    assert _saved() == [("user", "Count", ""), ("assistant", partial, "stopped")]
