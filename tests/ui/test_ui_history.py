"""History: hotkey action results kept beside chats; the History window searches both, opens a
chat, deletes one or all, exports Markdown; the keep_history preference keeps nothing; a broken
file is set aside and the user told."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QMessageBox
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

from app.paths import data_dir
from app.settings.store import settings_path
from app.ui.action_history import ActionHistory, ActionRecord
from app.ui.app import TrayApp
from app.ui.history import ChatHistory, Conversation
from app.ui.history_export import entries, entry_markdown
from app.ui.i18n import set_language


@pytest.fixture
def tray(qtbot):
    clipboard = QGuiApplication.clipboard()
    app = TrayApp(opener=FakeOpener(), hotkey_factory=FakeHotkeys, injector=RecordingInjector(clipboard, "words"),
                  with_tray_icon=False)
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()
    yield app
    app.shutdown()


def _run_action(qtbot, app: TrayApp, action_id: str, text: str) -> str:
    with qtbot.waitSignal(app.action_controller.answered, timeout=5000) as answered:
        app.run_action(action_id, text)
    return answered.args[0]


def test_an_action_result_is_kept_with_its_action_text_answer_and_model(qtbot, tray):
    answer = _run_action(qtbot, tray, "summarize", "The budget review moved to Friday afternoon.")
    records, notices = ActionHistory().load_all()
    assert notices == [] and len(records) == 1
    record = records[0]
    assert (record.action, record.action_id, record.source, record.answer, record.model, record.origin) == (
        "Summarize", "summarize", "The budget review moved to Friday afternoon.", answer, "SmolLM2-135M-Instruct",
        "given")
    assert answer == "Summary: to Friday afternoon."
    files = list((data_dir() / "action-results").iterdir())
    assert [f.name for f in files] == [f"{record.id}.json"]  # one file each, no temp file left
    assert json.loads(files[0].read_text(encoding="utf-8"))["answer"] == answer


def test_with_history_off_nothing_is_written(qtbot, tray):
    tray.store.update(keep_history=False)
    _run_action(qtbot, tray, "translate", "会议改到周五。")
    tray.open_chat()
    chat = tray.chat_window
    chat.input.setPlainText("hello")
    chat.send_button.click()
    qtbot.waitUntil(lambda: len(chat.conversation.messages) == 2, timeout=5000)
    assert chat.list.count() == 1  # the conversation is there for this run
    assert not (data_dir() / "action-results").exists() and not (data_dir() / "chats").exists()
    tray.open_history()
    assert tray.history.window.status.text() == "History is off (Settings → System): nothing new is kept"


def _keep_chat(title: str, answer: str, updated: float) -> Conversation:
    conversation = Conversation(updated=updated)
    conversation.add("user", title)
    conversation.add("assistant", answer)
    conversation.updated = updated
    ChatHistory().save(conversation)
    return conversation


def test_the_history_window_searches_opens_deletes_and_exports(qtbot, tray, tmp_path, monkeypatch):
    chat = _keep_chat("What is a KV cache?", "It keeps the keys and values of earlier tokens.", 1000.0)
    ActionHistory().save(ActionRecord("Translate", "会议改到周五下午。", "The meeting moved to Friday afternoon.",
                                      "Qwen2.5-3B", "translate", created=2000.0))
    ActionHistory().save(ActionRecord("Summarize", "Invoices are due on the 30th.", "Pay by the 30th.",
                                      "Qwen2.5-3B", "summarize", created=3000.0))
    tray.open_history()
    window = tray.history.window
    qtbot.addWidget(window)
    assert [window.list.item(i).text() for i in range(window.list.count())] == [
        "Summarize: Invoices are due on the 30th.", "Translate: 会议改到周五下午。", "Chat: What is a KV cache?"]

    window.search.setText("friday MEETING")  # every word, any case, in the text or the answer
    assert [e.title() for e in window.shown] == ["Translate: 会议改到周五下午。"]
    assert "The meeting moved to Friday afternoon." in window.view.markdown_text()
    window.search.setText("keys values")
    assert [e.id for e in window.shown] == [chat.id] and window.open_button.isEnabled()
    window.open_button.click()
    assert tray.chat_window.isVisible() and tray.chat_window.conversation.id == chat.id

    window.search.clear()
    exported = tmp_path / "out" / "history.md"
    exported.parent.mkdir()
    window.export_to(exported)
    text = exported.read_text(encoding="utf-8")
    assert text.startswith("# Qwen Tray history\n")
    assert text.index("## Summarize") < text.index("## Translate") < text.index("## Chat: What is a KV cache?")
    assert "**Text:**\n\n```text\n会议改到周五下午。\n```" in text  # what was typed, as typed
    assert "**Assistant:**\n\nIt keeps the keys" in text
    assert [p.name for p in exported.parent.iterdir()] == ["history.md"]  # written atomically: no temp file left
    assert window.status.text() == f"Exported 3 entries to {exported}"
    assert exported.stat().st_mode & 0o777 == 0o644  # a document to share, unlike the private history
    _answer_the_export_dialog(monkeypatch, str(exported.parent / "notes"))  # a name typed without .md
    window._choose_export_file()
    assert (exported.parent / "notes.md").read_text(encoding="utf-8") == text

    window.list.setCurrentRow(0)
    window.delete_button.click()
    assert [r.action for r in ActionHistory().load_all()[0]] == ["Translate"]
    window.delete_all_button.click()
    assert window.confirm.isVisible()
    window.confirm.button(QMessageBox.Yes).click()
    assert ActionHistory().load_all()[0] == [] and ChatHistory().load_all()[0] == []
    assert window.list.count() == 0
    assert tray.chat_window.conversation.messages == [] and tray.chat_window.list.count() == 0  # gone there too


def test_long_chinese_text_is_shortened_in_the_list_as_english_is(qtbot, tray):
    chinese = "会议决定把产品发布推迟到七月，并要求各部门在月底前提交新的计划。" * 25  # no spaces at all
    english = "The meeting decided to push the product launch to July and asked every team for a plan."
    ActionHistory().save(ActionRecord("Summarize", chinese, "a", "m", "summarize", created=2000.0))
    ActionHistory().save(ActionRecord("Summarize", english, "a", "m", "summarize", created=1000.0))
    tray.open_history()
    window = tray.history.window
    qtbot.addWidget(window)
    assert [window.list.item(i).text() for i in range(window.list.count())] == [
        f"Summarize: {chinese[:40]}…", "Summarize: The meeting decided to push the product launch to July …"]


def _answer_the_export_dialog(monkeypatch, typed: str) -> list[QFileDialog]:
    """The modal dialog answered as a user typing a name and pressing Save; the dialogs shown, returned."""
    shown = []

    def exec_(dialog):
        shown.append(dialog)
        dialog.selectFile(typed)
        return QFileDialog.Accepted

    monkeypatch.setattr(QFileDialog, "exec", exec_)
    return shown


def test_the_export_dialog_is_all_in_chinese_in_the_chinese_ui(qtbot, tray, tmp_path, monkeypatch):
    ActionHistory().save(ActionRecord("翻译", "会议改到周五下午。", "The meeting moved.", "m", "translate"))
    set_language("zh_CN")
    tray.open_history()
    window = tray.history.window
    qtbot.addWidget(window)
    shown = _answer_the_export_dialog(monkeypatch, str(tmp_path / "历史"))
    window._choose_export_file()
    labels = [shown[0].labelText(label) for label in (QFileDialog.LookIn, QFileDialog.FileName,
                                                       QFileDialog.FileType, QFileDialog.Accept, QFileDialog.Reject)]
    assert labels == ["查找范围(&L)：", "文件名(&N)：", "文件类型(&T)：", "保存(&S)", "取消"]  # (Qt: "&Look in:")
    assert shown[0].windowTitle() == "导出为 Markdown" and (tmp_path / "历史.md").is_file()


def test_in_chinese_the_answer_is_headed_answer_with_full_width_colons(qtbot, tray, tmp_path):
    ActionHistory().save(ActionRecord("润色改写", "会议改到周五下午。", "会议改至周五下午。", "Qwen2.5-3B", "rewrite"))
    set_language("zh_CN")
    tray.open_history()
    window = tray.history.window
    qtbot.addWidget(window)
    assert window.list.item(0).text() == "润色改写：会议改到周五下午。"
    shown = window.view.markdown_text()
    assert "**文本：**" in shown and "**回答：**" in shown and "· 模型：Qwen2.5-3B*" in shown
    assert "回答方式" not in shown and ":**" not in shown  # the mode's label is not the answer's heading
    window.export_to(tmp_path / "历史.md")
    assert "**回答：**\n\n会议改至周五下午。" in (tmp_path / "历史.md").read_text(encoding="utf-8")
    set_language("en")
    english = entry_markdown(window.shown[0])
    assert "**Text:**" in english and "**Answer:**" in english and "· Model: Qwen2.5-3B*" in english


def test_a_broken_result_file_is_set_aside_and_the_user_told(qtbot, tray):
    folder = data_dir() / "action-results"
    ActionHistory().save(ActionRecord("Explain", "ok text", "ok answer", "m"))
    (folder / "broken.json").write_text('{"action": "Explain"', encoding="utf-8")
    (folder / "wrong.json").write_text(json.dumps({"action": 3, "source": "", "answer": "", "model": ""}),
                                       encoding="utf-8")
    told = []
    tray.notified.connect(told.append)
    tray.open_history()
    assert tray.history.window.list.count() == 1
    backups = sorted(p.name for p in folder.glob("*.corrupt-*.json"))
    assert [b.split(".corrupt-")[0] for b in backups] == ["broken", "wrong"]
    assert len(told) == 2 and all("A history file was unreadable and has been moved to" in t for t in told)
    assert (folder / backups[0]).read_text(encoding="utf-8") == '{"action": "Explain"'  # kept as it was


def test_entries_of_both_kinds_sort_newest_first():
    old = Conversation(updated=10.0)
    new = ActionRecord("Explain", "a", "b", "m", created=20.0)
    assert [e.id for e in entries([old], [new])] == [new.id, old.id]


def _chat_file(name: str, inner_id: str, text: str) -> Path:
    folder = data_dir() / "chats"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"id": inner_id, "title": text, "created": 1.0, "updated": 1.0, "messages": [
        {"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]}), encoding="utf-8")
    return path


def test_continuing_a_chat_writes_its_own_file_whatever_id_it_holds(qtbot, tray):
    tray.store.update(max_tokens=300)
    settings = settings_path()
    before = settings.read_text(encoding="utf-8")
    chat_file = _chat_file("x", os.path.relpath(settings.with_suffix(""), data_dir() / "chats"), "continue me")
    tray.open_chat()
    chat = tray.chat_window
    chat.open_conversation("x")
    chat.input.setPlainText("more please")
    chat.send_button.click()
    qtbot.waitUntil(lambda: len(chat.conversation.messages) == 4, timeout=5000)
    assert settings.read_text(encoding="utf-8") == before  # was overwritten by the conversation
    assert [p.name for p in chat_file.parent.iterdir()] == ["x.json"]
    saved = json.loads(chat_file.read_text(encoding="utf-8"))
    assert saved["id"] == "x" and [m["content"] for m in saved["messages"]][:3] == ["continue me", "ok", "more please"]
    assert chat.list.count() == 1


def test_a_copied_history_file_is_an_entry_of_its_own_and_is_deleted_alone():
    _chat_file("good1", "good1", "first")
    _chat_file("good1 copy", "good1", "first")
    history = ChatHistory()
    assert sorted(c.id for c in history.load_all()[0]) == ["good1", "good1 copy"]
    history.delete("good1")
    assert [c.id for c in ChatHistory().load_all()[0]] == ["good1 copy"]
    results = ActionHistory()
    results.save(ActionRecord("Explain", "a", "b", "m", id="r1"))
    moved = results.folder / "r2.json"
    (results.folder / "r1.json").rename(moved)  # a copy's id no longer matches its name
    record, = ActionHistory().load_all()[0]
    assert record.id == "r2"
    results.delete(record.id)
    assert list(results.folder.iterdir()) == []


@pytest.mark.parametrize("speed", ["fast", [1], None, True, -3, float("nan")])
def test_a_chat_with_a_speed_that_is_no_number_opens_with_its_text(qtbot, tray, speed):
    path = _chat_file("hand-edited", "hand-edited", "What is a KV cache?")
    data = json.loads(path.read_text(encoding="utf-8"))
    data["messages"][1] = {"role": "assistant", "content": "It keeps keys and values.", "tokens_per_second": speed}
    path.write_text(json.dumps(data), encoding="utf-8")
    tray.open_chat()
    chat = tray.chat_window
    chat.open_conversation("hand-edited")
    assert [w.text() for w in chat.message_widgets()] == ["What is a KV cache?", "It keeps keys and values."]
    assert chat.message_widgets()[1].speed.text() == "" and chat.notices == []
    assert list(path.parent.iterdir()) == [path]  # not set aside: nothing in it is lost
