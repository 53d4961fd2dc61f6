"""A read-only Markdown view that can take streamed text without re-rendering on every token; or,
``plain``, a view of text shown exactly as typed (the user's own chat messages: pasted code and
logs keep their line breaks, spaces, underscores, stars and angle brackets)."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QTextBrowser, QWidget

RENDER_INTERVAL_MS = 50  # re-render at most 20 times a second while tokens stream in


class MarkdownView(QTextBrowser):
    def __init__(self, parent: QWidget | None = None, plain: bool = False):
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.plain = plain
        self._text = ""
        self._timer = QTimer(self, singleShot=True, interval=RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._render)

    def markdown_text(self) -> str:
        """The text as given (what Copy copies)."""
        return self._text

    def set_text(self, text: str) -> None:
        self._text = text
        self._render()

    def append_text(self, delta: str) -> None:
        self._text += delta
        if not self._timer.isActive():
            self._timer.start()

    def flush(self) -> None:
        """Render now (at the end of a stream)."""
        self._timer.stop()
        self._render()

    def _render(self) -> None:
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        if self.plain:
            self.setPlainText(self._text)  # (selectable as any text here: a QTextBrowser)
        else:
            self.setMarkdown(self._text)
        if at_bottom:
            bar.setValue(bar.maximum())
