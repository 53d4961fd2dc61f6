"""The small always-on-top answer popup shown near the cursor.

It never takes keyboard focus (Qt.WindowDoesNotAcceptFocus + show without activating), so
the user's text field keeps the focus and "Replace" can paste straight back into it.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QCursor, QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.engine.params import GenerationResult
from app.ui.i18n import tr
from app.ui.widgets.markdown_view import MarkdownView

POPUP_SIZE = (460, 300)


class ResultPopup(QWidget):
    copyRequested = Signal()
    replaceRequested = Signal()
    retryRequested = Signal()
    stopRequested = Signal()
    undoRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, Qt.Tool | Qt.WindowStaysOnTopHint | Qt.WindowDoesNotAcceptFocus)
        self.setAttribute(Qt.WA_ShowWithoutActivating)
        self.setObjectName("resultPopup")
        self.resize(*POPUP_SIZE)
        self.title = QLabel()
        self.title.setStyleSheet("font-weight: 600")
        self.status = QLabel()
        self.status.setStyleSheet("color: palette(mid)")
        self.progress = QProgressBar(maximumHeight=6, textVisible=False)
        self.view = MarkdownView(self)
        self.view.setFocusPolicy(Qt.NoFocus)
        self.copy_button = self._button(tr("Copy"), self.copyRequested)
        self.replace_button = self._button(tr("Replace selection"), self.replaceRequested)
        self.retry_button = self._button(tr("Retry"), self.retryRequested)
        self.stop_button = self._button(tr("Stop"), self.stopRequested)
        self.undo_button = self._button(tr("Undo"), self.undoRequested)
        self.close_button = self._button(tr("Close"), None)
        self.close_button.clicked.connect(self.hide)
        self.can_replace = True
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.status)
        buttons = QHBoxLayout()
        for b in (self.copy_button, self.replace_button, self.undo_button, self.retry_button, self.stop_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addWidget(self.progress)
        layout.addWidget(self.view, 1)
        layout.addLayout(buttons)
        self.finished = False

    def _button(self, text: str, signal: Signal | None) -> QPushButton:
        button = QPushButton(text)
        button.setFocusPolicy(Qt.NoFocus)
        if signal is not None:
            button.clicked.connect(signal.emit)
        return button

    # -- driven by the action controller -------------------------------------------------------
    def begin(self, title: str, near: QPoint | None = None, can_replace: bool = True) -> None:
        self.finished = False
        self.can_replace = can_replace
        self.title.setText(title)
        self.status.setText(tr("Thinking…"))
        self.view.set_text("")
        self.progress.setRange(0, 0)  # busy indicator until the first token
        self.progress.show()
        self._set_running(True)
        self.undo_button.hide()
        self.move_near(near if near is not None else QCursor.pos())
        self.show()
        self.raise_()

    def append(self, delta: str) -> None:
        if self.progress.maximum() == 0 and not self.view.markdown_text():
            self.progress.hide()
            self.status.setText(tr("Writing…"))
        self.view.append_text(delta)

    def set_step(self, done: int, total: int) -> None:
        """Long text: part ``done`` of ``total`` is being processed."""
        self.progress.show()
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.status.setText(tr("Part {done} of {total}", done=min(done + 1, total), total=total))

    def finish(self, result: GenerationResult) -> None:
        self.finished = True
        self.view.flush()
        self.progress.hide()
        self._set_running(False)
        if result.finish_reason == "cancelled":
            self.status.setText(tr("Stopped"))
        else:
            self.status.setText(tr("{tps:.1f} tokens/s", tps=result.tokens_per_second))

    def fail(self, message: str) -> None:
        self.finished = True
        self.view.flush()
        self.progress.hide()
        self._set_running(False)
        self.replace_button.setEnabled(False)
        self.copy_button.setEnabled(False)
        self.status.setText(tr("Error"))
        self.view.set_text(message)

    def show_replaced(self) -> None:
        self.status.setText(tr("Replaced"))
        self.undo_button.show()

    def answer_text(self) -> str:
        return self.view.markdown_text()

    def _set_running(self, running: bool) -> None:
        self.stop_button.setEnabled(running)
        for b in (self.copy_button, self.retry_button):
            b.setEnabled(not running)
        self.replace_button.setEnabled(not running and self.can_replace)

    def move_near(self, pos: QPoint) -> None:
        """Below-right of ``pos``, kept inside the screen the cursor is on."""
        screen = QGuiApplication.screenAt(pos) or QGuiApplication.primaryScreen()
        area = screen.availableGeometry()
        x = min(max(pos.x() + 12, area.left()), area.right() - self.width())
        y = pos.y() + 16
        if y + self.height() > area.bottom():
            y = pos.y() - self.height() - 16  # no room below: open above the cursor
        self.move(x, max(y, area.top()))
