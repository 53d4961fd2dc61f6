"""Copy the user's selection out of the focused window, and say honestly where the text came from.

1. Wait (at most ``KEYS_UP_TIMEOUT_MS``) until every key is up: on X11 a key sent while the
   hotkey's own key is held goes to the program that grabbed the hotkey, not to the window.
2. Send the focused application's copy keys (Ctrl+C; Ctrl+Shift+C in a terminal; see
   shortcuts.py) and wait until the clipboard really changed: the platform's change count
   (X11 XFixes, Windows' sequence number, macOS' changeCount), else Qt's signal. One retry.
3. Nothing copied: X11's PRIMARY selection (what is selected, without any key), else the
   text already on the clipboard, each marked as such: never passed off as the selection.

The user's clipboard (every format) is put back before ``finished`` is emitted. Everything
runs on the UI thread and never blocks: the waits are one polling timer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QClipboard

from app.ui.platform.clipboard import ClipboardSnapshot
from app.ui.platform.keyinput import KeyInjector
from app.ui.platform.shortcuts import chord_for, is_terminal_style, style_for
from app.ui.text_preview import text_preview

KEYS_UP_TIMEOUT_MS = 1000  # the user may keep holding the hotkey; after this the copy goes out anyway
COPY_TIMEOUT_MS = 600  # how long one copy may take before it is sent again (once)
COPY_ATTEMPTS = 2
SETTLE_MS = 200  # after the platform saw the change, how long Qt may take to see it too
POLL_MS = 10

ORIGINS = ("selection", "primary", "clipboard", "given")


@dataclass(frozen=True)
class CapturedText:
    """Text an action runs on and where it came from.

    ``origin``: "selection" (copied from the focused window just now), "primary" (X11's
    primary selection: the copy did not work), "clipboard" (what was on the clipboard
    before: nothing was copied) or "given" (handed in by the caller).
    """

    text: str
    origin: str
    focus: object | None = None  # the window the text came from (paste goes back there)
    style: str = "standard"  # its copy/paste keys (shortcuts.py)
    copy_keys: str = ""  # the copy keys that were sent ("" when none could be)

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ValueError(f"unknown text origin {self.origin!r}")

    @property
    def replaceable(self) -> bool:
        """Only a selection copied just now can be replaced, and not in a terminal (pasting there
        types at the prompt; its text is not replaced and Ctrl+Z cannot undo it)."""
        return self.origin == "selection" and not is_terminal_style(self.style)

    def preview(self, words: int = 8) -> str:
        """The first words (or characters, for Chinese), for "from the clipboard: …"."""
        return text_preview(self.text, words)


class SelectionCapture(QObject):
    """Copies of the selection, one at a time; each ``start`` ends in one ``finished(CapturedText)``."""

    finished = Signal(object)

    def __init__(self, clipboard: QClipboard, injector: KeyInjector, copy_timeout_ms: int = COPY_TIMEOUT_MS,
                 keys_up_timeout_ms: int = KEYS_UP_TIMEOUT_MS, parent: QObject | None = None):
        super().__init__(parent)
        self._clipboard, self._injector = clipboard, injector
        self.copy_timeout_ms, self.keys_up_timeout_ms = copy_timeout_ms, keys_up_timeout_ms
        self._overrides: dict[str, str] = {}
        self._timer = QTimer(self, interval=POLL_MS)
        self._timer.timeout.connect(self._tick)
        self.snapshot: ClipboardSnapshot | None = None
        self.focus: object | None = None
        self.style = "standard"
        self._phase = "idle"  # idle → keys → copy → done
        self._since = 0.0  # when the current phase (or copy attempt) began
        self._attempts = 0
        self._baseline: int | None = None
        self._qt_changed = False
        self._changed_at: float | None = None

    @property
    def busy(self) -> bool:
        return self._phase not in ("idle", "done")

    def start(self, overrides: Mapping[str, str] | None = None) -> None:
        """Copy the selection; ``overrides``: the user's copy keys per application (shortcuts.py)."""
        if self.busy:
            return
        self._overrides = dict(overrides or {})
        self._attempts, self._changed_at = 0, None
        self.snapshot = ClipboardSnapshot.take(self._clipboard)
        self.focus = self._injector.remember_focus()
        self.style = style_for(self._injector.app_ids(self.focus), self._overrides)
        self._clipboard.dataChanged.connect(self._on_qt_changed)
        if not self._injector.can_send_keys or chord_for("copy", self.style) is None:
            self._fallback()
            return
        self._phase, self._since = "keys", time.monotonic()
        self._timer.start()
        self._tick()

    def _on_qt_changed(self) -> None:
        if self._phase == "copy":
            self._qt_changed = True

    def _tick(self) -> None:
        now = time.monotonic()
        if self._phase == "keys":
            if not self._injector.keys_held() or now - self._since >= self.keys_up_timeout_ms / 1000:
                self._send_copy()
        elif self._phase == "copy":
            if self._changed():
                self._changed_at = self._changed_at or now
                if self._qt_changed or now - self._changed_at >= SETTLE_MS / 1000:
                    self._read_copy()
            elif now - self._since >= self.copy_timeout_ms / 1000:
                if self._attempts < COPY_ATTEMPTS:
                    self._send_copy()
                else:
                    self._fallback()

    def _send_copy(self) -> None:
        if self._attempts == 0:
            self._baseline = self._injector.clipboard_change_count()
            self._qt_changed = False
        if self._injector.keys_held():
            self._injector.release_modifiers()  # held past the wait: at least the target sees plain Ctrl+C
        self._phase, self._since = "copy", time.monotonic()
        self._attempts += 1
        self._injector.send_shortcut("copy", self.style)

    def _changed(self) -> bool:
        count = self._injector.clipboard_change_count()
        return count != self._baseline if count is not None else self._qt_changed

    def _read_copy(self) -> None:
        mime = self._clipboard.mimeData()
        text = mime.text() if mime is not None and mime.hasText() else ""
        # A copy without text (an image was selected) is still what the window copied: say so.
        self._finish(CapturedText(text, "selection", self.focus, self.style, self._copy_keys()))

    def _fallback(self) -> None:
        """Nothing was copied: X11's primary selection, else the clipboard as it was, marked as such."""
        keys = self._copy_keys() if self._attempts else ""
        cb = self._clipboard
        if cb.supportsSelection() and not cb.ownsSelection():  # our own popup's text is not the user's selection
            primary = cb.text(QClipboard.Selection)
            if primary.strip():
                self._finish(CapturedText(primary, "primary", self.focus, self.style, keys))
                return
        text = self.snapshot.text if self.snapshot is not None else ""
        self._finish(CapturedText(text, "clipboard", self.focus, self.style, keys))

    def _copy_keys(self) -> str:
        chord = chord_for("copy", self.style)
        return str(chord) if chord is not None else ""

    def _finish(self, captured: CapturedText) -> None:
        changed = self._phase == "copy" and (self._qt_changed or self._changed())
        self._phase = "done"  # (before emitting: a slot may start the next copy)
        self._timer.stop()
        self._clipboard.dataChanged.disconnect(self._on_qt_changed)
        if changed and self.snapshot is not None:
            self.snapshot.restore(self._clipboard)
        self.finished.emit(captured)
