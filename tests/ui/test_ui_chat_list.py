"""The chat window's list of conversations: a conversation continued from a popup is titled by
its action and text, the latest active conversation comes first, and one deleted in History
leaves the list, with history on or off; a chat file with a message field this version does not
know opens all the same."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector, send_and_wait

from app.ui.app import TrayApp
from app.ui.history import ChatHistory, Conversation


@pytest.fixture
def tray(qtbot):
    app = TrayApp(opener=FakeOpener(), hotkey_factory=FakeHotkeys,
                  injector=RecordingInjector(QGuiApplication.clipboard(), None), with_tray_icon=False)
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()
    yield app
    app.shutdown()


def _titles(chat) -> list[str]:
    return [chat.list.item(i).text() for i in range(chat.list.count())]



def test_each_conversation_continued_from_a_popup_is_titled_by_its_action_and_text(qtbot, tray):
    for text in ("Our server crashed twice last night.", "The launch moved to May 4."):
        with qtbot.waitSignal(tray.action_controller.answered, timeout=5000):
            tray.run_action("summarize", text)
        tray.action_controller.popup.chat_button.click()
    assert _titles(tray.chat_window) == ["Summarize: The launch moved to May 4.",
                                         "Summarize: Our server crashed twice last night."]


def _keep_chat(question: str, updated: float) -> Conversation:
    conversation = Conversation()
    conversation.add("user", question)
    conversation.add("assistant", "An answer.")
    conversation.updated = updated
    ChatHistory().save(conversation)
    return conversation


def test_a_continued_conversation_moves_to_the_top(qtbot, tray):
    older, newer = _keep_chat("Older chat", 1000.0), _keep_chat("Newer chat", 2000.0)
    tray.open_chat()
    chat = tray.chat_window
    assert _titles(chat) == ["Newer chat", "Older chat"]
    chat.list.itemClicked.emit(chat.list.item(1))
    assert chat.conversation.id == older.id
    send_and_wait(qtbot, chat, "One more question")
    assert _titles(chat) == ["Older chat", "Newer chat"]
    assert [c.id for c in ChatHistory().load_all()[0]] == [older.id, newer.id]  # as History sorts them


def test_a_chat_deleted_in_history_while_history_is_off_leaves_the_chat_window(qtbot, tray):
    kept = _keep_chat("Kept before history was turned off", 1000.0)
    tray.store.update(keep_history=False)
    tray.open_chat()
    chat = tray.chat_window
    send_and_wait(qtbot, chat, "This run's own chat")  # never written: only this window has it
    chat.open_conversation(kept.id)
    tray.open_history()
    history = tray.history.window
    qtbot.addWidget(history)
    history.list.setCurrentRow(next(i for i in range(history.list.count())
                                    if history.list.item(i).data(Qt.UserRole) == kept.id))
    history.delete_button.click()
    assert ChatHistory().load_all()[0] == []
    assert _titles(chat) == ["This run's own chat"]
    assert chat.conversation.messages == []  # it was shown: it is gone there too
    chat.open_conversation(kept.id)
    assert chat.conversation.id != kept.id and chat.message_widgets() == []


@pytest.mark.parametrize("extra", [{"finish": "exploded"}, {"finish": ["stopped"]}, {"rating": 5}],
                         ids=["unknown finish", "finish no string", "a newer version's field"])
def test_a_chat_file_with_an_odd_message_field_opens_with_its_text(qtbot, tray, extra):
    conversation = _keep_chat("What is a KV cache?", 1000.0)
    path = ChatHistory().folder / f"{conversation.id}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["messages"][1].update(extra)
    path.write_text(json.dumps(data), encoding="utf-8")
    tray.open_chat()
    chat = tray.chat_window
    chat.open_conversation(conversation.id)
    assert [w.text() for w in chat.message_widgets()] == ["What is a KV cache?", "An answer."]
    assert chat.conversation.messages[1].finish == "" and chat.notices == [] and chat.scroll.notes() == []
    assert list(path.parent.iterdir()) == [path]  # not set aside
