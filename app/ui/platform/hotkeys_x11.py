"""X11 global hotkeys: ``XGrabKey`` on the root window, events read on one thread.

The thread owns its own display connection (grabs are delivered to the connection that
made them), so register/unregister are sent to it as commands and wait for the answer.
A key another client already grabbed comes back as ``BadAccess``: that is a conflict.
"""

from __future__ import annotations

import os
import queue
import select
import threading
from collections.abc import Callable

from Xlib import XK, X, display, error

from app.settings.keys import Hotkey, HotkeyConflictError, HotkeyError
from app.ui.platform.hotkeys_base import HotkeyBackend

_MASKS = {"ctrl": X.ControlMask, "alt": X.Mod1Mask, "shift": X.ShiftMask, "super": X.Mod4Mask}
# NumLock (Mod2) and CapsLock (Lock) must not stop a hotkey: grab every combination of them.
_IGNORED = (0, X.LockMask, X.Mod2Mask, X.LockMask | X.Mod2Mask)
_RELEVANT = X.ControlMask | X.Mod1Mask | X.ShiftMask | X.Mod4Mask
# X auto-repeat sends a release+press pair with one timestamp; the press can arrive in a later
# read, so a release only counts once this long has passed with nothing after it.
AUTOREPEAT_WAIT_S = 0.05
_KEYSYM_NAMES = {
    "Space": "space", "Enter": "Return", "Tab": "Tab", "Esc": "Escape", "Backspace": "BackSpace",
    "Insert": "Insert", "Delete": "Delete", "Home": "Home", "End": "End", "PageUp": "Prior",
    "PageDown": "Next", "Up": "Up", "Down": "Down", "Left": "Left", "Right": "Right",
    ",": "comma", ".": "period", "/": "slash", ";": "semicolon", "-": "minus", "=": "equal",
    "`": "grave", "'": "apostrophe", "[": "bracketleft", "]": "bracketright", "\\": "backslash",
}


def keysym_for(key: str) -> int:
    name = _KEYSYM_NAMES.get(key, key.lower() if len(key) == 1 else key)
    sym = XK.string_to_keysym(name)
    if not sym:
        raise HotkeyError("key {key!r} has no X11 keysym", key=key)
    return sym


class X11Hotkeys(HotkeyBackend):
    name = "x11"

    def __init__(self, on_activate: Callable[[str], None]):
        super().__init__(on_activate)
        self._display = display.Display(os.environ.get("DISPLAY"))
        self._root = self._display.screen().root
        self._grabs: dict[tuple[int, int], str] = {}  # (keycode, mask) -> binding id
        self._down: set[int] = set()  # keycodes of hotkeys held down (a release ends it, whatever modifiers remain)
        self._pending_release: tuple[int, int] | None = None  # (keycode, time) of a release not yet final
        self._commands: queue.Queue = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="x11-hotkeys", daemon=True)
        self._thread.start()

    # -- called from the UI thread ------------------------------------------------------
    def register(self, binding_id: str, hotkey: Hotkey) -> None:
        self._call(self._grab, binding_id, hotkey)

    def unregister_all(self) -> None:
        if self._running:
            self._call(self._ungrab_all)

    def close(self) -> None:
        if not self._running:
            return
        self.unregister_all()
        self._running = False
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        self._display.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _call(self, fn, *args):
        done = threading.Event()
        box: dict = {}
        self._commands.put((fn, args, done, box))
        os.write(self._wake_w, b"c")
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    # -- the hotkey thread ------------------------------------------------------------------
    def _loop(self) -> None:
        fd = self._display.fileno()
        while self._running:
            self._run_commands()
            while self._display.pending_events():
                self._handle(self._display.next_event())
            timeout = AUTOREPEAT_WAIT_S if self._pending_release is not None else 1.0
            readable, _, _ = select.select([fd, self._wake_r], [], [], timeout)
            if self._wake_r in readable:
                os.read(self._wake_r, 64)
            if not readable:
                self._end_release()  # nothing followed the release: the key really went up
        self._run_commands()

    def _run_commands(self) -> None:
        while True:
            try:
                fn, args, done, box = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                box["value"] = fn(*args)
            except (HotkeyError, HotkeyConflictError) as e:
                box["error"] = e
            finally:
                done.set()

    def _grab(self, binding_id: str, hotkey: Hotkey) -> None:
        keycode = self._display.keysym_to_keycode(keysym_for(hotkey.key))
        if not keycode:
            raise HotkeyError("hotkey {hotkey}: key {key!r} is not on this keyboard layout", hotkey=hotkey,
                              key=hotkey.key)
        mask = 0
        for m in hotkey.modifiers:
            mask |= _MASKS[m]
        catcher = error.CatchError(error.BadAccess)
        for extra in _IGNORED:
            self._root.grab_key(keycode, mask | extra, True, X.GrabModeAsync, X.GrabModeAsync, onerror=catcher)
        self._display.sync()
        if catcher.get_error() is not None:
            for extra in _IGNORED:
                self._root.ungrab_key(keycode, mask | extra)
            self._display.sync()
            raise HotkeyConflictError("hotkey {hotkey} is already taken by another program", hotkey=hotkey)
        self._grabs[(keycode, mask)] = binding_id

    def _ungrab_all(self) -> None:
        for keycode, mask in self._grabs:
            for extra in _IGNORED:
                self._root.ungrab_key(keycode, mask | extra)
        self._display.sync()
        self._grabs.clear()
        self._down.clear()

    def _handle(self, event) -> None:
        if event.type == X.KeyRelease:
            self._end_release()
            self._pending_release = (event.detail, event.time)
            return
        if event.type != X.KeyPress:
            return
        if self._pending_release is not None:
            if self._pending_release == (event.detail, event.time):
                self._pending_release = None
                return  # auto-repeat: the key is still held
            self._end_release()
        binding_id = self._grabs.get((event.detail, event.state & _RELEVANT))
        if binding_id is not None and event.detail not in self._down:
            self._down.add(event.detail)
            self._on_activate(binding_id)

    def _end_release(self) -> None:
        """Modifiers may already be up when the key is released: match the keycode alone."""
        if self._pending_release is not None:
            self._down.discard(self._pending_release[0])
            self._pending_release = None
