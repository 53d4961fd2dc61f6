"""The chat window: multi-turn streaming, Markdown, Stop, tokens/s, copy, persisted history."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QSplitter
from ui_fakes import FakeOpener, TokenGate, send_and_wait

from app.engine.request import PRIORITY_NORMAL
from app.ui.controllers.engine_host import EngineHost
from app.ui.history import ChatHistory
from app.ui.models import ModelEntry
from app.settings.store import SettingsStore
from app.ui.preferences import PreferencesStore
from app.ui.widgets.chat import ChatWindow


@pytest.fixture
def host(qtbot):
    host = EngineHost(FakeOpener(answer=lambda m: f"**Answer {len(m)}** for `{m[-1]['content']}`"))
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(ModelEntry("fake", path="/fake"))
    yield host
    host.shutdown()



def test_multi_turn_chat_streams_markdown_and_saves_history(qtbot, host):
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    send_and_wait(qtbot, window, "What is a KV cache?")
    send_and_wait(qtbot, window, "And paged attention?")
    messages, params, priority = host.backend.requests[1]
    assert priority == PRIORITY_NORMAL
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # the whole conversation is sent
    assert messages[1]["content"] == "**Answer 1** for `What is a KV cache?`"
    widgets = window.message_widgets()
    assert [w.role for w in widgets] == ["user", "assistant", "user", "assistant"]
    rendered = widgets[3].view.toPlainText()
    assert rendered == "Answer 3 for And paged attention?"  # Markdown rendered: no ** or backticks
    assert "tokens/s" in widgets[3].speed.text() and "tokens/s" in window.status.text()
    assert f"{host.backend.name} · CPU — " in window.status.text()  # where it runs, in words as the tray says it
    saved, notices = ChatHistory().load_all()
    assert notices == [] and len(saved) == 1
    assert [m.content for m in saved[0].messages] == [m.content for m in window.conversation.messages]
    assert window.list.count() == 1 and window.list.item(0).text() == "What is a KV cache?"


def test_history_reopens_in_a_new_window_and_new_chat_starts_empty(qtbot, host):
    first = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(first)
    send_and_wait(qtbot, first, "Remember me")
    second = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(second)
    assert second.list.count() == 1
    second.open_conversation(second.list.item(0).data(256))
    assert [w.text() for w in second.message_widgets()] == ["Remember me", "**Answer 1** for `Remember me`"]
    second.new_button.click()
    qtbot.waitUntil(lambda: second.message_widgets() == [], timeout=2000)
    assert second.conversation.messages == []


def test_stop_keeps_the_partial_answer(qtbot, host):
    gate = host.backend.gate = TokenGate()
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText("Tell me a long story")
    window.send_button.click()
    gate.release(1)
    qtbot.waitUntil(lambda: window.message_widgets()[-1].text() == "**Answer ", timeout=5000)
    assert window.stop_button.isEnabled() and not window.send_button.isEnabled()
    window.stop_button.click()
    qtbot.waitUntil(lambda: window.task is None, timeout=5000)
    assert window.status.text().endswith("Stopped")
    last = window.conversation.messages[-1]
    assert (last.role, last.content, last.finish) == ("assistant", "**Answer ", "stopped")
    assert ChatHistory().load_all()[0][0].messages[-1] == last  # saved, marked stopped
    assert window.scroll.notes() == ["Stopped"]  # said under the answer
    assert window.send_button.isEnabled()


def test_copy_a_message(qtbot, host):
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    send_and_wait(qtbot, window, "copy test")
    window.message_widgets()[1].copy_button.click()
    assert QGuiApplication.clipboard().text() == "**Answer 1** for `copy test`"


def test_no_model_says_so(qtbot):
    window = ChatWindow(EngineHost(FakeOpener()), PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText("hello")
    window.send_button.click()
    assert "No model is ready" in window.status.text()
    assert window.conversation.messages == []


def _loading_host(qtbot, gate, fail=frozenset()):
    host = EngineHost(FakeOpener(gate, fail=set(fail)))
    host.switch_to(ModelEntry("Qwen2.5-3B-Instruct", path="/fake"))
    qtbot.waitUntil(lambda: host.progress[2] == 3, timeout=5000)  # loading, held at the gate
    return host


def test_a_message_sent_while_the_model_loads_is_answered_once_it_is_ready(qtbot):
    gate = threading.Event()
    host = _loading_host(qtbot, gate)
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText("hello")
    window.send_button.click()
    assert window.status.text().startswith("Loading Qwen2.5-3B-Instruct…")
    assert [m.content for m in window.conversation.messages] == ["hello"] and window.input.toPlainText() == ""
    assert [m.content for m in ChatHistory().load_all()[0][0].messages] == ["hello"]  # kept should the app quit now
    assert window.stop_button.isEnabled() and not window.send_button.isEnabled()
    gate.set()
    qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=10000)
    assert window.conversation.messages[1].role == "assistant" and window.conversation.messages[1].content
    host.shutdown()


@pytest.mark.parametrize("how", ["load fails", "stop"])
def test_a_waiting_message_goes_back_to_the_input_box_unsent(qtbot, how):
    gate = threading.Event()
    host = _loading_host(qtbot, gate, fail={"Qwen2.5-3B-Instruct"} if how == "load fails" else ())
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText("hello")
    window.send_button.click()
    if how == "stop":
        window.stop_button.click()
        assert window.status.text() == "Stopped"
    gate.set()
    qtbot.waitUntil(lambda: host.state in ("error", "ready"), timeout=10000)
    qtbot.wait(50)
    if how == "load fails":
        assert window.status.text() == "The model could not be loaded: Qwen2.5-3B-Instruct: config.json not found"
    assert window.conversation.messages == [] and window.input.toPlainText() == "hello"
    assert window.send_button.isEnabled() and window.message_widgets() == []
    assert ChatHistory().load_all()[0] == [] and window.list.count() == 0  # saved when sent, taken back with it
    if how == "stop":
        assert host.backend.requests == []
    host.shutdown()


def test_engine_error_is_shown_in_the_answer(qtbot, host):
    def broken(messages):
        raise RuntimeError("boom")

    host.backend._answer = broken
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.input.setPlainText("hello")
    window.send_button.click()
    qtbot.waitUntil(lambda: window.task is None, timeout=5000)
    assert "Internal error: RuntimeError: boom" in window.message_widgets()[-1].text()


@pytest.mark.parametrize("long_line", [
    "出错 — 无法加载模型：坏模型 的文件夹已不存在（/tmp/模型/不存在）：请在菜单的“模型”列表中选择其他模型，或在“设置 → 模型”中移除它"
    * 5, "Error: " + "/very/long/path" * 20], ids=["chinese", "no-spaces"])
def test_a_long_status_line_wraps_and_keeps_the_windows_width(qtbot, host, long_line):
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    splitter = window.findChild(QSplitter)
    width, sizes = window.width(), splitter.sizes()
    window.status.setText(long_line[:300])
    QApplication.processEvents()  # (the layout catches up)
    assert len(window.status.text()) == 300
    assert window.width() == width and splitter.sizes() == sizes  # the chat list keeps its width too


def test_window_geometry_is_remembered(qtbot, host):
    store = PreferencesStore()
    window = ChatWindow(host, store)
    qtbot.addWidget(window)
    window.resize(700, 500)
    window.show()
    window.close()
    assert "chat" in SettingsStore().load().preferences.geometry
    again = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(again)
    assert (again.width(), again.height()) == (700, 500)


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, host):
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(window.input.hasFocus, timeout=5000)  # type at once
    qtbot.keyClicks(window.input, "first line")
    qtbot.keyClick(window.input, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(window.input, "second line")
    assert window.input.toPlainText() == "first line\nsecond line" and host.backend.requests == []
    qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=5000)
    assert window.conversation.messages[0].content == "first line\nsecond line"
    assert window.input.toPlainText() == ""
    assert "Enter to send" in window.input.placeholderText()


def test_the_ctrl_enter_setting_sends_with_ctrl_enter_only(qtbot, host):
    store = PreferencesStore()
    store.update(chat_send_key="ctrl_enter")
    window = ChatWindow(host, store)
    qtbot.addWidget(window)
    qtbot.keyClicks(window.input, "one")
    qtbot.keyClick(window.input, Qt.Key_Return)
    qtbot.keyClicks(window.input, "two")
    assert window.input.toPlainText() == "one\ntwo" and host.backend.requests == []
    qtbot.keyClick(window.input, Qt.Key_Return, Qt.ControlModifier)
    qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=5000)
    assert window.conversation.messages[0].content == "one\ntwo"
    assert "Ctrl+Enter to send" in window.input.placeholderText()


def test_a_popup_answer_continues_as_a_new_conversation(qtbot, host):
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.start_conversation([{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Summarize:\n\nThe selected text."},
                               {"role": "assistant", "content": "A summary."}])
    assert [w.role for w in window.message_widgets()] == ["user", "assistant"]  # the system prompt is not shown
    assert window.list.count() == 1 and window.list.item(0).text() == "Summarize:"
    send_and_wait(qtbot, window, "Shorter, please.")
    messages = host.backend.requests[-1][0]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"].endswith("The selected text.") and messages[2]["content"] == "A summary."


def _stream_partly(qtbot, window, host, gate, text, tokens):
    """Send ``text`` and let the slow answer write ``tokens`` pieces; returns them."""
    window.input.setPlainText(text)
    window.send_button.click()
    gate.release(tokens)
    partial = "".join(word + " " for word in host.backend._answer([]).split(" ")[:tokens])
    qtbot.waitUntil(lambda: window.message_widgets()[-1].text() == partial, timeout=5000)
    return partial


@pytest.mark.parametrize("switch", ["new chat", "open another", "continue a popup answer"])
def test_switching_conversations_while_an_answer_streams_keeps_it_and_frees_the_window(qtbot, host, caplog, switch):
    host.backend._answer = lambda m: "one two three four five six seven eight nine ten"
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    send_and_wait(qtbot, window, "An earlier chat")
    earlier = window.conversation.id
    window.new_chat()
    gate = host.backend.gate = TokenGate()  # a slow model: one word per release
    with qtbot.captureExceptions() as exceptions:
        partial = _stream_partly(qtbot, window, host, gate, "Count to ten", 3)
        answered = window.conversation.id
        if switch == "new chat":
            window.new_button.click()
        elif switch == "open another":
            window.list.itemClicked.emit(next(window.list.item(i) for i in range(window.list.count())
                                              if window.list.item(i).data(Qt.UserRole) == earlier))
        else:
            window.start_conversation([{"role": "user", "content": "Popup"}, {"role": "assistant", "content": "Done."}])
        assert window.send_button.isEnabled() and not window.stop_button.isEnabled()
        assert window.status.text().endswith("Stopped") and "Writing" not in window.status.text()
        gate.release(100)  # the old task's late tokens and its end
        qtbot.waitUntil(lambda: not host.busy, timeout=5000)
        host.backend.gate = None
        send_and_wait(qtbot, window, "Send works again")
        qtbot.wait(100)  # anything the old task still had queued
    assert exceptions == [] and not [r for r in caplog.records if r.levelname == "ERROR"]
    saved = {c.id: c for c in ChatHistory().load_all()[0]}
    assert [(m.role, m.content) for m in saved[answered].messages] == [("user", "Count to ten"),
                                                                        ("assistant", partial)]
    assert saved[answered].messages[1].tokens_per_second > 0  # completed when the old task ended
    assert window.conversation.id != answered and window.conversation.messages[-1].content.startswith("one two")
    assert [w.text() for w in window.message_widgets()][-2:] == ["Send works again", "one two three four five six "
                                                                 "seven eight nine ten"]
    assert window.list.count() == (3 if switch != "open another" else 2)


def test_the_view_follows_new_messages_and_a_streaming_answer_unless_the_user_scrolled_up(qtbot, host):
    host.backend._answer = lambda m: " ".join(f"Paragraph{i}\n\n" for i in range(60))  # one paragraph a token
    window = ChatWindow(host, PreferencesStore())
    qtbot.addWidget(window)
    window.resize(500, 400)
    window.show()
    qtbot.waitExposed(window)
    bar = window.scroll.verticalScrollBar()

    def settled_at_bottom(longer_than=0):
        qtbot.waitUntil(lambda: bar.maximum() > longer_than and bar.value() == bar.maximum(), timeout=5000)
        return bar.maximum()

    send_and_wait(qtbot, window, "A long answer, please")
    end = settled_at_bottom()  # the whole answer was followed to its end
    gate = host.backend.gate = TokenGate()
    window.input.setPlainText("Another one")
    window.send_button.click()
    end = settled_at_bottom(end)  # the new message is in view
    for _ in range(3):  # the answer grows: the view keeps up
        gate.release(5)
        end = settled_at_bottom(end)
    bar.setValue(0)  # the user scrolls up to read
    gate.release(10)
    qtbot.waitUntil(lambda: bar.maximum() > end, timeout=5000)
    qtbot.wait(100)
    assert bar.value() == 0  # not yanked down
    bar.setValue(bar.maximum())  # back at the bottom: followed again
    gate.release(100)
    qtbot.waitUntil(lambda: window.task is None, timeout=5000)
    settled_at_bottom(end)
    assert window.message_widgets()[-1].text().endswith("Paragraph59\n\n")
