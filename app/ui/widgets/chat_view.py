"""The chat window's conversation: its messages one under another, with a note under an answer
that did not end by itself (stopped, cut off at the answer length) or was written without the
oldest turns, and the view kept at the newest text while the user reads there."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from app.ui.history import ChatMessage, finish_note
from app.ui.i18n import tr
from app.ui.widgets.message_view import MessageWidget

FOLLOW_SLACK_PX = 8  # this close to the bottom still counts as reading the newest text


def outcome_text(finish: str, tokens_per_second: float) -> str:
    """The status line's word on the last answer: its speed, and how it ended (as the popup says it)."""
    if finish == "length":
        return tr("Cut off at the answer length · {tps:.1f} tokens/s", tps=tokens_per_second)
    speed = tr("{tps:.1f} tokens/s", tps=tokens_per_second)
    return f"{speed} — {tr('Stopped')}" if finish == "stopped" else speed


def left_out_note(turns: int) -> str:
    """Said under an answer written without the oldest ``turns`` questions and answers."""
    if turns == 1:
        return tr("The oldest question and its answer were left out to fit the model's context")
    return tr("The {n} oldest questions and their answers were left out to fit the model's context", n=turns)


class ConversationView(QScrollArea):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, widgetResizable=True)
        box = QWidget()
        self._layout = QVBoxLayout(box)
        self._layout.addStretch(1)
        self.setWidget(box)
        # The range grows when the layout catches up with a new or growing message (later than
        # the change itself), so the view follows the range, not the change.
        self._follow = True  # at the bottom: keep the newest text in view; off while reading above
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)

    def show_messages(self, messages: list[ChatMessage]) -> None:
        self.clear()
        for m in messages:
            if m.role != "system":  # an action's instructions to the model: sent, not shown
                self.add_message(m.role, m.content, m.tokens_per_second)
                if m.finish:
                    self.add_note(finish_note(m.finish))

    def clear(self) -> None:
        while self._layout.count() > 1:
            self._layout.takeAt(0).widget().deleteLater()

    def add_message(self, role: str, text: str, tps: float = 0.0) -> MessageWidget:
        return self._add(MessageWidget(role, text, tps))

    def add_note(self, text: str) -> QLabel:
        """A line under the message above it; hidden while it says nothing."""
        note = QLabel(text, wordWrap=True, objectName="chatNote")
        note.setTextInteractionFlags(Qt.TextSelectableByMouse)
        note.setStyleSheet("font-style: italic")
        note.setVisible(bool(text))
        return self._add(note)

    def remove(self, widget: QWidget) -> None:
        self._layout.removeWidget(widget)
        widget.deleteLater()

    def _add(self, widget: QWidget) -> QWidget:
        self._layout.insertWidget(self._layout.count() - 1, widget)
        self._follow = True  # something new is shown, wherever the user had scrolled to
        return widget

    def _widgets(self) -> list[QWidget]:
        return [self._layout.itemAt(i).widget() for i in range(self._layout.count() - 1)]

    def message_widgets(self) -> list[MessageWidget]:
        return [w for w in self._widgets() if isinstance(w, MessageWidget)]

    def notes(self) -> list[str]:
        """The notes shown, top to bottom."""
        return [w.text() for w in self._widgets() if isinstance(w, QLabel) and w.text()]

    def _scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - FOLLOW_SLACK_PX

    def _range_changed(self, _minimum: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)
