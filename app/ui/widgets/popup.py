"""The small always-on-top answer popup shown near the cursor, usable from the keyboard.

It takes the keyboard focus when it opens (the target window keeps its selection: nothing
there is touched, and paste gives the focus back to it first). Keys: Esc stops a running
answer, else closes; Ctrl+C copies the answer (or what is selected in the popup);
Ctrl+Enter replaces the selection; Ctrl+R retries; Tab walks the instruction box, the
answer and the buttons. The instruction box ("Ask about this text…") runs a free-form
instruction on the same text. The width never changes (Undo keeps its place when hidden).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QCursor, QGuiApplication, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QSizePolicy,
                               QTextBrowser, QVBoxLayout, QWidget)

from app.engine.params import GenerationResult
from app.ui.i18n import tr
from app.ui.widgets.markdown_view import MarkdownView

POPUP_SIZE = (560, 320)


class ResultPopup(QWidget):
    copyRequested = Signal()
    replaceRequested = Signal()
    retryRequested = Signal()
    stopRequested = Signal()
    undoRequested = Signal()
    continueRequested = Signal()  # "Continue in chat"
    instructionSubmitted = Signal(str)
    closed = Signal(bool)  # the popup was closed; True when it had the keyboard focus

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, Qt.Tool | Qt.WindowStaysOnTopHint)
        self.setObjectName("resultPopup")
        self.title = QLabel()
        self.title.setStyleSheet("font-weight: 600")
        self.title.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # long titles never widen it
        self.status = QLabel()  # normal text colour: a greyed status is hard to read
        self.source = QLabel()
        self.source.setWordWrap(True)
        self.source.setTextFormat(Qt.PlainText)
        self.progress = QProgressBar(maximumHeight=6, textVisible=False)
        self.view = MarkdownView(self)
        self.view.setFocusPolicy(Qt.StrongFocus)  # reachable with Tab, to scroll and select
        self.instruction = QLineEdit()
        self.instruction.setPlaceholderText(tr("Ask about this text…"))
        self.instruction.returnPressed.connect(self._submit_instruction)
        self.copy_button = self._button(tr("Copy"), self.copyRequested, "Ctrl+C")
        self.replace_button = self._button(tr("Replace selection"), self.replaceRequested, "Ctrl+Enter")
        self.undo_button = self._button(tr("Undo"), self.undoRequested)
        self.retry_button = self._button(tr("Retry"), self.retryRequested, "Ctrl+R")
        self.stop_button = self._button(tr("Stop"), self.stopRequested, "Esc")
        self.chat_button = self._button(tr("Continue in chat"), self.continueRequested)
        self.close_button = self._button(tr("Close"), None, "Esc")
        self.close_button.clicked.connect(self.close_popup)
        policy = self.undo_button.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.undo_button.setSizePolicy(policy)
        self._layout()
        self._shortcuts()
        self.can_replace = True
        self.replace_note = ""
        self.finished = False
        self.undo_button.hide()
        self.setFixedWidth(max(POPUP_SIZE[0], self.minimumSizeHint().width()))
        self.resize(self.width(), POPUP_SIZE[1])

    def _button(self, text: str, signal: Signal | None, keys: str = "") -> QPushButton:
        button = QPushButton(text)
        button.setAutoDefault(False)
        if keys:
            button.setToolTip(keys)
        if signal is not None:
            button.clicked.connect(signal.emit)
        return button

    def _layout(self) -> None:
        header = QHBoxLayout()
        header.addWidget(self.title, 1)
        header.addWidget(self.status)
        buttons = QHBoxLayout()
        for b in (self.copy_button, self.replace_button, self.undo_button, self.retry_button, self.stop_button,
                  self.chat_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addLayout(header)
        layout.addWidget(self.source)
        layout.addWidget(self.progress)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.instruction)
        layout.addLayout(buttons)
        order = [self.instruction, self.view, self.copy_button, self.replace_button, self.undo_button,
                 self.retry_button, self.stop_button, self.chat_button, self.close_button]
        for first, second in zip(order, order[1:], strict=False):
            QWidget.setTabOrder(first, second)

    def _shortcuts(self) -> None:
        for keys, slot in (("Esc", self._escape), ("Ctrl+Return", self._replace_key), ("Ctrl+Enter", self._replace_key),
                           ("Ctrl+R", self._retry_key)):
            QShortcut(QKeySequence(keys), self, activated=slot, context=Qt.WindowShortcut)
        # Ctrl+C: the focused text widget copies its own selection; without one, the answer is copied.
        for widget in (self.instruction, self.view):
            widget.installEventFilter(self)
        QShortcut(QKeySequence.Copy, self, activated=self._copy_key, context=Qt.WindowShortcut)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt)
        if event.type() == QEvent.ShortcutOverride and isinstance(event, QKeyEvent) \
                and event.matches(QKeySequence.Copy) and not self._has_selection(watched):
            event.ignore()  # let the window's Ctrl+C shortcut have it: copy the whole answer
            return True
        return super().eventFilter(watched, event)

    @staticmethod
    def _has_selection(widget: QObject) -> bool:
        if isinstance(widget, QLineEdit):
            return widget.hasSelectedText()
        return isinstance(widget, QTextBrowser) and widget.textCursor().hasSelection()

    # -- keys ----------------------------------------------------------------------------------
    def _escape(self) -> None:
        if self.stop_button.isEnabled():
            self.stopRequested.emit()
        else:
            self.close_popup()

    def _replace_key(self) -> None:
        if self.replace_button.isEnabled():
            self.replaceRequested.emit()

    def _retry_key(self) -> None:
        if self.retry_button.isEnabled():
            self.retryRequested.emit()

    def _copy_key(self) -> None:
        if self.copy_button.isEnabled():
            self.copyRequested.emit()

    def _submit_instruction(self) -> None:
        text = self.instruction.text().strip()
        if text:
            self.instructionSubmitted.emit(text)

    def close_popup(self) -> None:
        had_focus = self.isActiveWindow()
        self.hide()
        self.closed.emit(had_focus)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt): the window manager's close button
        had_focus = self.isActiveWindow()
        super().closeEvent(event)
        self.closed.emit(had_focus)

    # -- driven by the action controller -------------------------------------------------------
    def begin(self, title: str, source: str, can_replace: bool, replace_note: str = "",
              near: QPoint | None = None) -> None:
        """A new answer: ``source`` says where the text came from; ``replace_note`` why Replace is off."""
        self.finished = False
        self.can_replace, self.replace_note = can_replace, replace_note
        self.title.setText(title)
        self.title.setToolTip(title)
        self.source.setText(source)
        self.status.setText(tr("Thinking…"))
        self.view.set_text("")
        self.progress.setRange(0, 0)  # busy indicator until the first token
        self.progress.show()
        self.undo_button.hide()
        self._set_running(True)
        if not self.isVisible():
            self.move_near(near if near is not None else QCursor.pos())
        self.show()
        self.raise_()
        self.activateWindow()
        self.instruction.setFocus(Qt.OtherFocusReason)

    def wait_for(self, status: str) -> None:
        """Before the first token: say what the answer waits for (the model being loaded)."""
        if not self.finished and not self.view.markdown_text():
            self.status.setText(status)

    def stop_waiting(self, status: str) -> None:
        """The wait ended without an answer (stopped, or no model to wait for any more)."""
        self.finished = True
        self.progress.hide()
        self._set_running(False)
        self.copy_button.setEnabled(False)
        self.chat_button.setEnabled(False)
        self.replace_button.setEnabled(False)
        self.status.setText(status)

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
        elif result.finish_reason == "length":
            self.status.setText(tr("Cut off at the answer length · {tps:.1f} tokens/s", tps=result.tokens_per_second))
        else:
            self.status.setText(tr("{tps:.1f} tokens/s", tps=result.tokens_per_second))

    def fail(self, message: str) -> None:
        self.finished = True
        self.view.flush()
        self.progress.hide()
        self._set_running(False)
        self.replace_button.setEnabled(False)
        self.copy_button.setEnabled(False)
        self.chat_button.setEnabled(False)
        self.status.setText(tr("Error"))
        self.view.set_text(message)

    def show_replaced(self, can_undo: bool) -> None:
        self.status.setText(tr("Replaced"))
        self.replace_button.setEnabled(False)  # done: a second Replace would paste the answer twice
        self.undo_button.setVisible(can_undo)

    def show_undone(self) -> None:
        self.status.setText(tr("Undone"))
        self.undo_button.hide()
        self.replace_button.setEnabled(self.can_replace and bool(self.answer_text().strip()))

    def answer_text(self) -> str:
        return self.view.markdown_text()

    def _set_running(self, running: bool) -> None:
        self.stop_button.setEnabled(running)
        for b in (self.copy_button, self.retry_button, self.chat_button):
            b.setEnabled(not running)
        self.replace_button.setEnabled(not running and self.can_replace)
        self.replace_button.setToolTip("Ctrl+Enter" if self.can_replace else self.replace_note)

    def move_near(self, pos: QPoint) -> None:
        """Below-right of ``pos``, kept inside the screen the cursor is on."""
        screen = QGuiApplication.screenAt(pos) or QGuiApplication.primaryScreen()
        area = screen.availableGeometry()
        x = min(max(pos.x() + 12, area.left()), area.right() - self.width())
        y = pos.y() + 16
        if y + self.height() > area.bottom():
            y = pos.y() - self.height() - 16  # no room below: open above the cursor
        self.move(x, max(y, area.top()))
