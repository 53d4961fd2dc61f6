"""Borrow the clipboard without losing what the user copied.

An action copies the selection through the clipboard (selection_capture.py) and pastes its
answer through it; both times the user's clipboard (every format: text, HTML, images,
files…) is taken first and put back afterwards. Everything here runs on the UI thread and
never blocks: waits are Qt timers and signals.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QMimeData, QObject, QTimer, Signal
from PySide6.QtGui import QClipboard

from app.ui.platform.keyinput import KeyInjector

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

    def paste(self, text: str, focus_token: object | None, style: str = "standard") -> None:
        """``style``: the target's keys (shortcuts.py): Ctrl+V, or Ctrl+Shift+V in a terminal."""
        if self._snapshot is None:
            self._snapshot = ClipboardSnapshot.take(self._clipboard)
        mime = QMimeData()
        mime.setText(text)
        self._clipboard.setMimeData(mime)
        self._injector.restore_focus(focus_token)
        self._injector.release_modifiers()
        self._injector.send_shortcut("paste", style)
        self._timer.start()  # restarted by a second paste: the target reads after its own Ctrl+V

    def undo(self, focus_token: object | None, style: str = "standard") -> bool:
        """Undo the paste in the target; False where its keys have no undo (never Ctrl+Z in a terminal)."""
        self._injector.restore_focus(focus_token)
        return self._injector.send_shortcut("undo", style)

    def flush(self) -> None:
        """Put the user's clipboard back now (also before a new copy starts)."""
        self._timer.stop()
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            snapshot.restore(self._clipboard)
            self.finished.emit()
