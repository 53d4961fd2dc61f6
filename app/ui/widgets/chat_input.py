"""The chat's input box: Enter sends and Shift+Enter starts a new line, or with the preference
``chat_send_key = "ctrl_enter"`` Ctrl+Enter sends and Enter starts a new line. Tab moves the
focus on (to Send, Stop, the list) instead of typing a tab: a question needs none, and the
keyboard must reach the buttons. Esc is left to the window (it stops an answer)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from app.ui.i18n import tr


class ChatInput(QPlainTextEdit):
    sendRequested = Signal()

    def __init__(self, send_key: Callable[[], str], parent: QWidget | None = None):
        """``send_key``: the chat_send_key preference, read at each key press."""
        super().__init__(parent)
        self._send_key = send_key
        self.setMaximumHeight(90)
        self.setTabChangesFocus(True)
        self.update_placeholder()

    def update_placeholder(self) -> None:
        if self._send_key() == "ctrl_enter":
            self.setPlaceholderText(tr("Ask anything… (Ctrl+Enter to send, Enter for a new line)"))
        else:
            self.setPlaceholderText(tr("Ask anything… (Enter to send, Shift+Enter for a new line)"))

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt)
        if event.key() in (Qt.Key_Return, Qt.Key_Enter):
            mods = event.modifiers() & ~Qt.KeypadModifier
            ctrl_sends = self._send_key() == "ctrl_enter"
            if mods == Qt.ControlModifier or (mods == Qt.NoModifier and not ctrl_sends):
                self.sendRequested.emit()
                return
            if mods == Qt.ShiftModifier or mods == Qt.NoModifier:
                self.insertPlainText("\n")  # a new paragraph, not Qt's line separator
                return
        super().keyPressEvent(event)
