"""The answer popup from the keyboard: focus on open, Esc, Ctrl+C, Ctrl+Enter, Ctrl+R, Tab order;
honest state after Replace and Undo; a width that never changes; readable status text."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from app.engine.params import GenerationResult, Usage
from app.ui.widgets.popup import ResultPopup

DONE = GenerationResult("An answer.", "stop", Usage(5, 3), (), 0.01, 0.1)


@pytest.fixture
def popup(qtbot):
    popup = ResultPopup()
    qtbot.addWidget(popup)
    popup.begin("Summarize", "Selected text: some words", can_replace=True)
    qtbot.waitUntil(popup.instruction.hasFocus, timeout=5000)  # its shortcuts need it to be the active window
    return popup


def _finish(popup, text="An answer."):
    popup.append(text)
    popup.finish(DONE)


def test_it_takes_the_focus_in_the_instruction_box(popup):
    assert popup.isActiveWindow() and popup.instruction.hasFocus()


def test_escape_stops_a_running_answer_then_closes(qtbot, popup):
    with qtbot.waitSignal(popup.stopRequested, timeout=1000):
        qtbot.keyClick(popup.instruction, Qt.Key_Escape)
    assert popup.isVisible()
    _finish(popup)
    with qtbot.waitSignal(popup.closed, timeout=1000) as closed:
        qtbot.keyClick(popup.instruction, Qt.Key_Escape)
    assert not popup.isVisible() and closed.args == [True]  # it had the focus: give it back


def test_ctrl_c_copies_the_answer_unless_text_in_the_popup_is_selected(qtbot, popup):
    _finish(popup)
    with qtbot.waitSignal(popup.copyRequested, timeout=1000):
        qtbot.keyClick(popup.instruction, Qt.Key_C, Qt.ControlModifier)
    popup.instruction.setText("my question")
    popup.instruction.selectAll()
    with qtbot.assertNotEmitted(popup.copyRequested):
        qtbot.keyClick(popup.instruction, Qt.Key_C, Qt.ControlModifier)
    assert QApplication.clipboard().text() == "my question"  # the line edit copied its own selection


def test_ctrl_enter_replaces_and_ctrl_r_retries_only_when_allowed(qtbot, popup):
    with qtbot.assertNotEmitted(popup.replaceRequested):
        qtbot.keyClick(popup.instruction, Qt.Key_Return, Qt.ControlModifier)  # still running
    _finish(popup)
    with qtbot.waitSignal(popup.replaceRequested, timeout=1000):
        qtbot.keyClick(popup.instruction, Qt.Key_Return, Qt.ControlModifier)
    with qtbot.waitSignal(popup.retryRequested, timeout=1000):
        qtbot.keyClick(popup.instruction, Qt.Key_R, Qt.ControlModifier)
    popup.begin("Summarize", "From the clipboard: x", can_replace=False, replace_note="not the selection")
    _finish(popup)
    with qtbot.assertNotEmitted(popup.replaceRequested):
        qtbot.keyClick(popup.instruction, Qt.Key_Return, Qt.ControlModifier)
    assert popup.replace_button.toolTip() == "not the selection"


def test_enter_in_the_instruction_box_submits_it(qtbot, popup):
    popup.instruction.setText("  What is the deadline?  ")
    with qtbot.waitSignal(popup.instructionSubmitted, timeout=1000) as submitted:
        qtbot.keyClick(popup.instruction, Qt.Key_Return)
    assert submitted.args == ["What is the deadline?"]


def test_tab_walks_the_instruction_the_answer_and_the_buttons(qtbot, popup):
    _finish(popup)
    order = []
    widget = popup.instruction
    for _ in range(8):
        order.append(widget)
        widget = widget.nextInFocusChain()
        while not (widget.isVisible() and widget.isEnabled() and widget.focusPolicy() & Qt.TabFocus):
            widget = widget.nextInFocusChain()
    assert order == [popup.instruction, popup.view, popup.copy_button, popup.replace_button, popup.retry_button,
                     popup.chat_button, popup.close_button, popup.instruction]


def test_replace_and_undo_keep_the_state_honest_and_the_width_fixed(popup):
    width = popup.width()
    _finish(popup)
    popup.show_replaced(can_undo=True)
    assert popup.status.text() == "Replaced" and not popup.replace_button.isEnabled()
    assert popup.undo_button.isVisible() and popup.width() == width
    popup.show_undone()
    assert popup.status.text() == "Undone" and not popup.undo_button.isVisible()
    assert popup.replace_button.isEnabled() and popup.width() == width
    popup.begin("A very long title " * 20, "From the clipboard: " + "word " * 80, can_replace=True)
    assert popup.status.text() == "Thinking…"  # no stale "Replaced" on a new answer
    assert popup.width() == width


def test_a_cut_off_answer_says_so(popup):
    popup.append("partial")
    popup.finish(GenerationResult("partial", "length", Usage(5, 16), (), 0.01, 0.1))
    assert popup.status.text().startswith("Cut off at the answer length")


def _luminance(color) -> float:
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    return 0.2126 * channel(color.redF()) + 0.7152 * channel(color.greenF()) + 0.0722 * channel(color.blueF())


def test_status_and_source_text_are_readable(popup):
    """WCAG's 4.5:1 contrast for normal text, against the popup's own background."""
    background = _luminance(popup.palette().color(QPalette.Window))
    for label in (popup.status, popup.source):
        text = _luminance(label.palette().color(QPalette.WindowText))
        light, dark = max(text, background), min(text, background)
        assert (light + 0.05) / (dark + 0.05) >= 4.5
