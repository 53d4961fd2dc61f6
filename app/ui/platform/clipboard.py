"""Borrow the clipboard without losing what the user copied.

An action copies the selection through the clipboard and pastes its answer through it;
both times the user's clipboard (every format: text, HTML, images, files…) is taken
first and put back afterwards. Everything here runs on the UI thread and never blocks:
waits are Qt timers and signals.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QMimeData, QObject, QTimer, Signal
from PySide6.QtGui import QClipboard

from app.ui.platform.keyinput import KeyInjector

COPY_TIMEOUT_MS = 800  # how long a target app gets to answer Ctrl+C before we use the clipboard as is
PASTE_SETTLE_MS = 400  # the target reads the clipboard after Ctrl+V asynchronously; keep ours that long


@dataclass(frozen=True)
class ClipboardSnapshot:
    """A copy of every format on the clipboard at one moment."""

    formats: tuple[tuple[str, bytes], ...]
    text: str

    @classmethod
    def take(cls, clipboard: QClipboard) -> ClipboardSnapshot:
        mime = clipboard.mimeData()
        if mime is None:
            return cls((), "")
        formats = tuple((fmt, bytes(mime.data(fmt).data())) for fmt in mime.formats())
        return cls(formats, mime.text() if mime.hasText() else "")

    def to_mime(self) -> QMimeData:
        mime = QMimeData()
        for fmt, data in self.formats:
            mime.setData(fmt, data)
        return mime

    def restore(self, clipboard: QClipboard) -> None:
        if self.formats:
            clipboard.setMimeData(self.to_mime())
        else:
            clipboard.clear()


class SelectionCapture(QObject):
    """Copy the user's selection: Ctrl+C into the focused window, wait for the clipboard to change.

    Emits ``finished(text, from_selection)``: the copied selection, or, when nothing changed
    within the timeout (nothing was selected), the text already on the clipboard. The
    user's clipboard is restored before ``finished`` is emitted.
    """

    finished = Signal(str, bool)

    def __init__(self, clipboard: QClipboard, injector: KeyInjector, timeout_ms: int = COPY_TIMEOUT_MS,
                 parent: QObject | None = None):
        super().__init__(parent)
        self._clipboard = clipboard
        self._injector = injector
        self._timer = QTimer(self, singleShot=True, interval=timeout_ms)
        self._timer.timeout.connect(self._on_timeout)
        self.snapshot: ClipboardSnapshot | None = None
        self.focus_token: object | None = None
        self._active = False
        self._changed = False

    def start(self) -> None:
        self.snapshot = ClipboardSnapshot.take(self._clipboard)
        self.focus_token = self._injector.remember_focus()
        self._active = True
        self._clipboard.dataChanged.connect(self._on_changed)
        self._timer.start()
        self._injector.release_modifiers()
        self._injector.send_shortcut("copy")

    def _on_changed(self) -> None:
        if not self._active:
            return
        self._changed = True
        mime = self._clipboard.mimeData()
        text = mime.text() if mime is not None and mime.hasText() else ""
        if text.strip():
            self._finish(text, True)
        # An empty or non-text change (an app that copies nothing): keep waiting for the timeout.

    def _on_timeout(self) -> None:
        if self._active:
            self._finish(self.snapshot.text if self.snapshot else "", False)

    def _finish(self, text: str, from_selection: bool) -> None:
        self._active = False
        self._timer.stop()
        self._clipboard.dataChanged.disconnect(self._on_changed)
        if self._changed and self.snapshot is not None:
            self.snapshot.restore(self._clipboard)
        self.finished.emit(text, from_selection)


class PasteOperation(QObject):
    """Paste ``text`` into the remembered window through the clipboard, then put the clipboard back.

    A second paste before the first one's clipboard came back keeps the first snapshot: the
    user's own clipboard is what returns, never one of our answers.
    """

    finished = Signal()

    def __init__(self, clipboard: QClipboard, injector: KeyInjector, settle_ms: int = PASTE_SETTLE_MS,
                 parent: QObject | None = None):
        super().__init__(parent)
        self._clipboard = clipboard
        self._injector = injector
        self._snapshot: ClipboardSnapshot | None = None  # the user's clipboard while ours is on it
        self._timer = QTimer(self, singleShot=True, interval=settle_ms)
        self._timer.timeout.connect(self.flush)

    @property
    def pending(self) -> bool:
        return self._snapshot is not None

    def paste(self, text: str, focus_token: object | None) -> None:
        if self._snapshot is None:
            self._snapshot = ClipboardSnapshot.take(self._clipboard)
        mime = QMimeData()
        mime.setText(text)
        self._clipboard.setMimeData(mime)
        self._injector.restore_focus(focus_token)
        self._injector.release_modifiers()
        self._injector.send_shortcut("paste")
        self._timer.start()  # restarted by a second paste: the target reads after its own Ctrl+V

    def undo(self, focus_token: object | None) -> None:
        self._injector.restore_focus(focus_token)
        self._injector.send_shortcut("undo")

    def flush(self) -> None:
        """Put the user's clipboard back now (also before a new copy starts)."""
        self._timer.stop()
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            snapshot.restore(self._clipboard)
            self.finished.emit()
