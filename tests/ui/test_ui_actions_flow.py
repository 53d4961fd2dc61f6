"""A hotkey action end to end offscreen: copy the selection, stream into the popup, replace,
and the user's clipboard (every format) comes back. Keys are recorded instead of sent."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QMimeData
from PySide6.QtGui import QGuiApplication
from ui_fakes import FakeOpener, RecordingInjector

from app.engine.request import PRIORITY_INTERACTIVE
from app.ui.actions import load_builtin_actions
from app.ui.controllers.action_controller import ActionController
from app.ui.controllers.engine_host import EngineHost
from app.ui.models import ModelEntry
from app.ui.platform.clipboard import ClipboardSnapshot
from app.ui.preferences import Preferences

ORIGINAL = {"text/plain": b"the user's own clipboard", "text/html": b"<b>the user's own clipboard</b>",
            "application/x-qwen-test": bytes(range(256))}


def _set_original(clipboard):
    mime = QMimeData()
    for fmt, data in ORIGINAL.items():
        mime.setData(fmt, data)
    clipboard.setMimeData(mime)


def _clipboard_formats(clipboard):
    mime = clipboard.mimeData()
    return {fmt: bytes(mime.data(fmt).data()) for fmt in mime.formats()}


@pytest.fixture
def clipboard(qapp):
    cb = QGuiApplication.clipboard()
    _set_original(cb)
    yield cb
    cb.clear()


@pytest.fixture
def host(qtbot):
    host = EngineHost(FakeOpener())
    with qtbot.waitSignal(host.loaded, timeout=5000):
        host.switch_to(ModelEntry("fake", path="/fake"))
    yield host
    host.shutdown()


def _controller(host, clipboard, selection, prefs=None):
    injector = RecordingInjector(clipboard, selection)
    prefs = prefs or Preferences()
    controller = ActionController(host, lambda: prefs, injector, clipboard)
    return controller, injector


def _action(action_id):
    return next(a for a in load_builtin_actions() if a.id == action_id)


def test_snapshot_restores_every_format_byte_for_byte(clipboard):
    snapshot = ClipboardSnapshot.take(clipboard)
    clipboard.setText("something else")
    snapshot.restore(clipboard)
    formats = _clipboard_formats(clipboard)
    for fmt, data in ORIGINAL.items():
        assert formats[fmt] == data


def test_hotkey_action_streams_into_popup_replaces_and_restores_clipboard(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "Revenue grew 12 percent in Q3.")
    answers = []
    controller.answered.connect(answers.append)
    controller.trigger(_action("summarize"))
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert injector.sent == ["release", "copy"]
    messages, _params, priority = host.backend.requests[0]
    assert priority == PRIORITY_INTERACTIVE
    assert messages[-1]["content"].endswith("Revenue grew 12 percent in Q3.")
    assert answers == ["Summary: percent in Q3."]
    assert controller.popup.isVisible() and controller.popup.answer_text() == answers[0]
    assert "tokens/s" in controller.popup.status.text()
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL  # restored after the copy

    pasted = []
    injector.send_shortcut = lambda action: pasted.append((action, clipboard.text()))
    with qtbot.waitSignal(controller._paster.finished, timeout=5000):
        controller.popup.replace_button.click()
    assert pasted == [("paste", answers[0])]  # the answer was on the clipboard when Ctrl+V went out
    assert injector.focus_restored == ["target-window"]
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL  # and restored again


def test_without_a_selection_the_clipboard_text_is_used(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, None)  # Ctrl+C changes nothing
    controller.capture_timeout_ms = 50
    answers = []
    controller.answered.connect(answers.append)
    controller.trigger(_action("explain"))
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert host.backend.requests[0][0][-1]["content"].endswith("the user's own clipboard")


def test_menu_trigger_uses_the_clipboard_without_sending_keys(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "ignored")
    answers = []
    controller.answered.connect(answers.append)
    controller.trigger(_action("summarize"), from_hotkey=False)
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert injector.sent == []
    assert host.backend.requests[0][0][-1]["content"].endswith("the user's own clipboard")
    assert not controller.popup.replace_button.isEnabled()  # no selection to replace
    assert controller.popup.copy_button.isEnabled()


def test_replace_mode_pastes_when_done_and_offers_undo(qtbot, host, clipboard):
    prefs = Preferences(action_modes={"rewrite": "replace"})
    controller, injector = _controller(host, clipboard, "teh text", prefs)
    with qtbot.waitSignal(controller._paster.finished, timeout=5000):
        controller.trigger(_action("rewrite"))
    assert injector.sent == ["release", "copy", "release", "paste"]
    assert controller.popup.undo_button.isVisibleTo(controller.popup)
    controller.popup.undo_button.click()
    assert injector.sent[-1] == "undo" and injector.focus_restored[-1] == "target-window"


def test_stop_and_retry(qtbot, host, clipboard):
    gate = threading.Event()
    host.backend.gate = gate
    controller, _ = _controller(host, clipboard, "a long text to explain")
    controller.trigger(_action("explain"))
    qtbot.waitUntil(lambda: len(host.backend.requests) == 1, timeout=5000)
    assert controller.popup.stop_button.isEnabled() and not controller.popup.replace_button.isEnabled()
    controller.popup.stop_button.click()
    qtbot.waitUntil(lambda: controller.popup.finished, timeout=5000)
    assert controller.popup.status.text() == "Stopped"
    gate.set()
    answers = []
    controller.answered.connect(answers.append)
    controller.popup.retry_button.click()
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert len(host.backend.requests) == 2
    assert host.backend.requests[0][0] == host.backend.requests[1][0]  # the same text again
    assert controller.popup.answer_text() == answers[0]


def test_no_model_is_reported_not_crashed(qtbot, clipboard):
    host = EngineHost(FakeOpener())
    controller, injector = _controller(host, clipboard, "x")
    with qtbot.waitSignal(controller.notify, timeout=1000) as notice:
        controller.trigger(_action("summarize"))
    assert "No model is ready" in notice.args[0]
    assert injector.sent == []


def test_copy_button_puts_the_answer_on_the_clipboard(qtbot, host, clipboard):
    controller, _ = _controller(host, clipboard, "Copy me please now.")
    answers = []
    controller.answered.connect(answers.append)
    controller.trigger(_action("summarize"))
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    controller.popup.copy_button.click()
    assert clipboard.text() == answers[0]


def test_replace_twice_quickly_still_restores_the_users_clipboard(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "Two quick replaces.")
    answers = []
    controller.answered.connect(answers.append)
    controller.trigger(_action("summarize"))
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    with qtbot.waitSignal(controller._paster.finished, timeout=5000):
        controller.popup.replace_button.click()
        controller.popup.replace_button.click()  # before the first paste's clipboard came back
    assert injector.sent.count("paste") == 2
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL
