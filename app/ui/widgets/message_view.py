"""One chat message: who said it, its text (grows with its content), Copy, tokens/s. An answer is
rendered as Markdown; the user's own message is shown as typed."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QSizePolicy, QVBoxLayout, QWidget

from app.ui.i18n import tr
from app.ui.markdown_fences import escaped
from app.ui.widgets.markdown_view import MarkdownView


class MessageWidget(QFrame):
    def __init__(self, role: str, text: str = "", tokens_per_second: float = 0.0, parent: QWidget | None = None):
        super().__init__(parent)
        self.role = role
        self.setFrameShape(QFrame.StyledPanel)
        self.setObjectName("userMessage" if role == "user" else "assistantMessage")
        who = QLabel(tr("You") if role == "user" else tr("Assistant"))
        who.setStyleSheet("font-weight: 600")
        self.speed = QLabel()  # normal text colour: a greyed label is hard to read
        self.copy_button = QPushButton(tr("Copy"))
        self.copy_button.setFlat(True)
        self.copy_button.clicked.connect(self.copy)
        header = QHBoxLayout()
        header.addWidget(who)
        header.addStretch(1)
        header.addWidget(self.speed)
        header.addWidget(self.copy_button)
        self.view = MarkdownView(self, plain=role == "user")
        self.view.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.view.setFrameShape(QFrame.NoFrame)
        self.view.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)
        self.view.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        # A code line wider than the view: a code block scrolls sideways (as in other chat apps), and
        # the bar that appears for it is counted in the height (it would cover the last line).
        self.view.horizontalScrollBar().rangeChanged.connect(self._fit_height)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addWidget(self.view)
        self.view.set_text(text)
        if tokens_per_second:
            self.finish(tokens_per_second)

    def _fit_height(self, *_changed: object) -> None:
        """As tall as the text (the view never scrolls up and down), and its horizontal scroll bar
        when it has one."""
        bar = self.view.horizontalScrollBar()
        bar_height = bar.sizeHint().height() if bar.maximum() > bar.minimum() else 0
        self.view.setFixedHeight(int(self.view.document().size().height()) + 8 + bar_height)

    def text(self) -> str:
        return self.view.markdown_text()

    def append(self, delta: str) -> None:
        self.view.append_text(delta)

    def finish(self, tokens_per_second: float) -> None:
        self.view.flush()
        if tokens_per_second:
            self.speed.setText(tr("{tps:.1f} tokens/s", tps=tokens_per_second))

    def show_error(self, message: str) -> None:
        self.view.set_text(f"**{tr('Error')}:** {escaped(message)}")  # a path's __init__ or * as typed

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.text())
