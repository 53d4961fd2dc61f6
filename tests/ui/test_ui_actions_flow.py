"""A hotkey action end to end offscreen: wait for the hotkey's keys to come up, copy the
selection (the app's own keys; never Ctrl+C into a terminal), stream into the popup, replace,
and the user's clipboard (every format) comes back. Text that was not copied from the
selection is said to come from the clipboard and cannot replace anything. Keys are recorded
instead of sent; a simulated target copies its selection on its copy keys."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QMimeData, Qt
from PySide6.QtGui import QGuiApplication, QImage
from ui_fakes import FakeOpener, RecordingInjector

from app.engine.request import PRIORITY_INTERACTIVE
from app.ui.actions import load_builtin_actions
from app.ui.controllers.action_controller import ActionController
from app.ui.controllers.engine_host import EngineHost
from app.ui.models import ModelEntry
from app.ui.platform.clipboard import ClipboardSnapshot
from app.ui.platform.selection_capture import SelectionCapture
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


def _controller(host, clipboard, selection, prefs=None, **injector_kwargs):
    injector = RecordingInjector(clipboard, selection, **injector_kwargs)
    prefs = prefs or Preferences()
    controller = ActionController(host, lambda: prefs, injector, clipboard, load_builtin_actions)
    return controller, injector


def _answer(qtbot, controller, action_id, text=None):
    answers = []
    controller.answered.connect(answers.append)
    controller.run_action(action_id, text)
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    controller.answered.disconnect(answers.append)
    return answers[0]


def _sent_text(host, n=-1):
    return host.backend.requests[n][0][-1]["content"]


def test_snapshot_restores_every_format_byte_for_byte(clipboard):
    snapshot = ClipboardSnapshot.take(clipboard)
    clipboard.setText("something else")
    snapshot.restore(clipboard)
    formats = _clipboard_formats(clipboard)
    for fmt, data in ORIGINAL.items():
        assert formats[fmt] == data


def test_hotkey_action_streams_into_popup_replaces_and_restores_clipboard(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "Revenue grew 12 percent in Q3.")
    started = []
    controller.started.connect(started.append)
    answer = _answer(qtbot, controller, "summarize")
    assert injector.sent == ["Ctrl+C"]  # no key was held: nothing to release
    assert started[0].origin == "selection" and started[0].text == "Revenue grew 12 percent in Q3."
    messages, _params, priority = host.backend.requests[0]
    assert priority == PRIORITY_INTERACTIVE
    assert messages[-1]["content"].endswith("Revenue grew 12 percent in Q3.")
    assert answer == "Summary: percent in Q3."
    popup = controller.popup
    assert popup.isVisible() and popup.answer_text() == answer
    assert "tokens/s" in popup.status.text()
    assert popup.source.text() == "Selected text: Revenue grew 12 percent in Q3."
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL  # restored after the copy

    pasted = []
    injector.send_chord = lambda chord: pasted.append((str(chord), clipboard.text()))
    with qtbot.waitSignal(controller._paster.finished, timeout=5000):
        popup.replace_button.click()
    assert pasted == [("Ctrl+V", answer)]  # the answer was on the clipboard when Ctrl+V went out
    assert injector.focus_restored == ["target-window"]
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL  # and restored again
    assert popup.status.text() == "Replaced" and not popup.replace_button.isEnabled()
    assert popup.undo_button.isVisibleTo(popup)

    popup.undo_button.click()
    assert pasted[-1][0] == "Ctrl+Z"
    assert popup.status.text() == "Undone" and not popup.undo_button.isVisibleTo(popup)
    assert popup.replace_button.isEnabled()  # the selection is back: it can be replaced again


def test_the_copy_waits_until_the_hotkey_is_released(qtbot, host, clipboard):
    """On X11 a key sent while the hotkey's own key is down goes to the program that grabbed it."""
    controller, injector = _controller(host, clipboard, "Held keys first.", held=[True] * 6)
    _answer(qtbot, controller, "summarize")
    assert injector.held == [] and injector.held_polls >= 7  # asked until the keys were up
    assert injector.sent == ["Ctrl+C"]
    assert _sent_text(host).endswith("Held keys first.")


def test_keys_held_too_long_are_released_and_the_copy_goes_out(qtbot, clipboard):
    injector = RecordingInjector(clipboard, "still copied", held=[True] * 100_000)
    capture = SelectionCapture(clipboard, injector, keys_up_timeout_ms=50)
    with qtbot.waitSignal(capture.finished, timeout=5000) as done:
        capture.start()
    assert done.args[0].origin == "selection" and done.args[0].text == "still copied"
    assert injector.sent == ["release", "Ctrl+C"]


def test_a_copy_that_does_not_land_is_sent_once_more(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "Second time lucky.", ignore_copies=1)
    controller.capture_timeout_ms = 100
    _answer(qtbot, controller, "explain")
    assert injector.sent == ["Ctrl+C", "Ctrl+C"]
    assert _sent_text(host).endswith("Second time lucky.")
    assert controller.popup.replace_button.isEnabled()


def test_without_a_copy_the_clipboard_is_used_and_said_so_and_replace_is_off(qtbot, host, clipboard):
    prefs = Preferences(action_modes={"rewrite": "replace"})
    controller, injector = _controller(host, clipboard, None, prefs)  # Ctrl+C copies nothing
    controller.capture_timeout_ms = 50
    started = []
    controller.started.connect(started.append)
    _answer(qtbot, controller, "rewrite")
    assert injector.sent == ["Ctrl+C", "Ctrl+C"]  # one retry
    assert started[0].origin == "clipboard" and _sent_text(host).endswith("the user's own clipboard")
    popup = controller.popup
    assert popup.source.text() == \
        "From the clipboard (Ctrl+C copied nothing from the selection): the user's own clipboard"
    assert not popup.replace_button.isEnabled()
    assert "did not come from the selection" in popup.replace_button.toolTip()
    controller.replace_selection()  # a "replace" action, Ctrl+Enter: nothing is pasted over a selection
    assert "Ctrl+V" not in injector.sent and not controller._paster.pending


def test_an_image_on_the_clipboard_does_not_hide_a_real_selection(qtbot, host, clipboard):
    image = QImage(8, 8, QImage.Format_RGB32)
    image.fill(0xFF336699)
    clipboard.setImage(image)
    controller, _injector = _controller(host, clipboard, "The selected words.")
    _answer(qtbot, controller, "summarize")
    assert _sent_text(host).endswith("The selected words.")
    assert clipboard.mimeData().hasImage() and not clipboard.mimeData().hasText()  # the image came back


def test_an_image_only_clipboard_and_a_failed_copy_do_not_claim_nothing_is_selected(qtbot, host, clipboard):
    image = QImage(8, 8, QImage.Format_RGB32)
    image.fill(0xFF336699)
    clipboard.setImage(image)
    controller, _injector = _controller(host, clipboard, None)
    controller.capture_timeout_ms = 50
    with qtbot.waitSignal(controller.notify, timeout=5000) as notice:
        controller.run_action("summarize")
    assert notice.args[0] == "Nothing was copied from the selection (Ctrl+C), and the clipboard holds no text"
    assert host.backend.requests == []


def test_a_terminal_gets_ctrl_shift_c_never_ctrl_c_and_is_not_pasted_into(qtbot, host, clipboard):
    prefs = Preferences(action_modes={"rewrite": "replace"})
    controller, injector = _controller(host, clipboard, "ls -la output", prefs, app_ids=("gnome-terminal-server",),
                                       copy_keys=frozenset({"Ctrl+Shift+C"}))
    _answer(qtbot, controller, "rewrite")
    assert injector.sent == ["Ctrl+Shift+C"]
    assert _sent_text(host).endswith("ls -la output")
    assert not controller.popup.replace_button.isEnabled()  # a terminal's text cannot be replaced
    assert "terminal" in controller.popup.replace_button.toolTip()
    assert not any(k in injector.sent for k in ("Ctrl+C", "Ctrl+V", "Ctrl+Z", "Ctrl+Shift+V"))


def test_the_users_per_application_keys_win(qtbot, host, clipboard):
    prefs = Preferences(copy_shortcuts={"MyEditor": "ctrl_insert"})
    controller, injector = _controller(host, clipboard, "insert-copied", prefs, app_ids=("myeditor",),
                                       copy_keys=frozenset({"Ctrl+Insert"}))
    _answer(qtbot, controller, "summarize")
    assert injector.sent == ["Ctrl+Insert"]
    assert _sent_text(host).endswith("insert-copied")


def test_menu_trigger_uses_the_clipboard_without_sending_keys(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "ignored")
    answers = []
    controller.answered.connect(answers.append)
    controller.run_on_clipboard("summarize")
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert injector.sent == []
    assert _sent_text(host).endswith("the user's own clipboard")
    assert controller.popup.source.text() == "From the clipboard: the user's own clipboard"
    assert not controller.popup.replace_button.isEnabled()  # no selection to replace
    assert controller.popup.copy_button.isEnabled()


def test_run_action_on_given_text_and_unknown_actions(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "ignored")
    _answer(qtbot, controller, "summarize", text="Given from the command line.")
    assert injector.sent == [] and _sent_text(host).endswith("Given from the command line.")
    assert not controller.popup.replace_button.isEnabled()
    with qtbot.waitSignal(controller.notify, timeout=1000) as notice:
        controller.run_action("no-such-action")
    assert notice.args[0] == "There is no action no-such-action"


def test_the_source_line_shortens_chinese_text_as_it_does_english(qtbot, host, clipboard):
    chinese = "会议决定把产品发布推迟到七月，并要求各部门在月底前提交新的计划。" * 25  # no spaces at all
    controller, _ = _controller(host, clipboard, "ignored")
    _answer(qtbot, controller, "summarize", text=chinese)
    assert controller.popup.source.text() == f"Given text: {chinese[:40]}…"
    _answer(qtbot, controller, "summarize", text="one two three four five six seven eight nine ten")
    assert controller.popup.source.text() == "Given text: one two three four five six seven eight …"


def test_the_instruction_box_runs_a_free_form_instruction_on_the_same_text(qtbot, host, clipboard):
    controller, _injector = _controller(host, clipboard, "Paris is the capital of France.")
    _answer(qtbot, controller, "summarize")
    popup = controller.popup
    answers = []
    controller.answered.connect(answers.append)
    popup.instruction.setText("Which country is this about?")
    qtbot.keyClick(popup.instruction, Qt.Key_Return)
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert len(host.backend.requests) == 2
    content = _sent_text(host)
    assert content.startswith("Which country is this about?") and content.endswith("Paris is the capital of France.")
    assert popup.title.text() == "Which country is this about?"
    assert popup.replace_button.isEnabled()  # still the selection's text


def test_continue_in_chat_carries_the_request_and_the_answer(qtbot, host, clipboard):
    controller, _injector = _controller(host, clipboard, "A short note.")
    answer = _answer(qtbot, controller, "summarize")
    with qtbot.waitSignal(controller.continueInChat, timeout=1000) as carried:
        controller.popup.chat_button.click()
    messages = carried.args[0]
    assert messages[-2]["role"] == "user" and messages[-2]["content"] == _sent_text(host)
    assert messages[-1] == {"role": "assistant", "content": answer}
    assert not controller.popup.isVisible()


def test_replace_mode_pastes_when_done_and_offers_undo(qtbot, host, clipboard):
    prefs = Preferences(action_modes={"rewrite": "replace"})
    controller, injector = _controller(host, clipboard, "teh text", prefs)
    with qtbot.waitSignal(controller._paster.finished, timeout=5000):
        controller.run_action("rewrite")
    assert injector.sent == ["Ctrl+C", "release", "Ctrl+V"]
    assert controller.popup.undo_button.isVisibleTo(controller.popup)
    controller.popup.undo_button.click()
    assert injector.sent[-1] == "Ctrl+Z" and injector.focus_restored[-1] == "target-window"


def test_stop_and_retry(qtbot, host, clipboard):
    gate = threading.Event()
    host.backend.gate = gate
    controller, _ = _controller(host, clipboard, "a long text to explain")
    controller.run_action("explain")
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
        controller.run_action("summarize")
    assert "No model is ready" in notice.args[0]
    assert injector.sent == []


def test_copy_button_puts_the_answer_on_the_clipboard(qtbot, host, clipboard):
    controller, _ = _controller(host, clipboard, "Copy me please now.")
    answer = _answer(qtbot, controller, "summarize")
    controller.popup.copy_button.click()
    assert clipboard.text() == answer


def test_replace_undo_replace_quickly_still_restores_the_users_clipboard(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "Two quick replaces.")
    _answer(qtbot, controller, "summarize")
    with qtbot.waitSignal(controller._paster.finished, timeout=5000):
        controller.popup.replace_button.click()
        controller.popup.replace_button.click()  # disabled once done: no second paste
        controller.popup.undo_button.click()
        controller.popup.replace_button.click()  # before the first paste's clipboard came back
    assert injector.sent.count("Ctrl+V") == 2 and injector.sent.count("Ctrl+Z") == 1
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL


def test_a_second_hotkey_while_the_popup_has_the_keyboard_works_on_the_same_text(qtbot, host, clipboard):
    controller, injector = _controller(host, clipboard, "Le rapport est prêt.")
    _answer(qtbot, controller, "summarize")
    qtbot.waitUntil(controller.popup.isActiveWindow, timeout=5000)
    _answer(qtbot, controller, "translate")
    assert injector.sent == ["Ctrl+C"]  # nothing was copied out of the popup
    assert _sent_text(host).endswith("Le rapport est prêt.")
    assert controller.popup.replace_button.isEnabled()  # the selection is still the user's


def test_quitting_while_a_paste_settles_puts_the_users_clipboard_back_at_once(qtbot, host, clipboard):
    """What the tray owns at its end is handed on as the user's clipboard (clipboard_keeper.py):
    never the answer that was pasted just before the quit."""
    controller, _injector = _controller(host, clipboard, "Quit right after Replace.")
    answer = _answer(qtbot, controller, "summarize")
    controller.popup.replace_button.click()
    assert controller._paster.pending and clipboard.text() == answer
    controller.shutdown()
    assert not controller._paster.pending
    assert {f: _clipboard_formats(clipboard)[f] for f in ORIGINAL} == ORIGINAL
