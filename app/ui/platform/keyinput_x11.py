"""X11 synthetic keys through XTest, key state through XQueryKeymap, clipboard changes through
XFixes selection events, the focused application through WM_CLASS (python-xlib).

Everything runs on the UI thread on this object's own display connection; the XFixes
events are read whenever the change count is asked for (no thread, no blocking).
"""

from __future__ import annotations

import os

from Xlib import XK, X, display, error
from Xlib.ext import xfixes, xtest
from Xlib.protocol import event as xevent

from app.settings.keys import Hotkey
from app.ui.platform.hotkeys_x11 import keysym_for
from app.ui.platform.keyinput_base import KeyInjector

_MODIFIER_KEYSYMS = ("Control_L", "Control_R", "Alt_L", "Alt_R", "Shift_L", "Shift_R",
                     "Super_L", "Super_R", "Meta_L", "Meta_R", "ISO_Level3_Shift")
_CHORD_MODIFIERS = {"ctrl": "Control_L", "shift": "Shift_L", "alt": "Alt_L", "super": "Super_L"}
_MAX_PARENTS = 8  # how far up from the focused widget's window a WM_CLASS is looked for


class X11KeyInjector(KeyInjector):
    name = "xtest"

    def __init__(self):
        self._display = display.Display(os.environ.get("DISPLAY"))
        self._closed = False
        if not self._display.has_extension("XTEST"):
            self._display.close()
            raise OSError("the X server has no XTEST extension")
        self._root = self._display.screen().root
        self._modifier_codes = sorted({
            code for name in _MODIFIER_KEYSYMS
            if (code := self._display.keysym_to_keycode(XK.string_to_keysym(name)))
        })
        self._clipboard_atom = self._display.intern_atom("CLIPBOARD")
        self._changes: int | None = None
        if self._display.has_extension("XFIXES"):
            # Events are matched by code: python-xlib may load the extension module twice (two classes).
            self._owner_event = self._display.query_extension("XFIXES").first_event + xfixes.XFixesSelectionNotify
            self._display.xfixes_query_version()
            self._display.xfixes_select_selection_input(self._root, self._clipboard_atom,
                                                        xfixes.XFixesSetSelectionOwnerNotifyMask)
            self._display.sync()
            self._changes = 0

    def _pressed(self, keycode: int) -> bool:
        keymap = self._display.query_keymap()  # 32 bytes, one bit per keycode
        return bool(keymap[keycode // 8] & (1 << (keycode % 8)))

    def keys_held(self) -> bool:
        return any(self._display.query_keymap())

    def release_modifiers(self) -> None:
        for code in self._modifier_codes:
            if self._pressed(code):
                xtest.fake_input(self._display, X.KeyRelease, code)
        self._display.sync()

    def send_chord(self, chord: Hotkey) -> None:
        mods = [self._keycode(XK.string_to_keysym(_CHORD_MODIFIERS[m])) for m in sorted(chord.modifiers)]
        key = self._keycode(keysym_for(chord.key))
        events = [(X.KeyPress, c) for c in mods] + [(X.KeyPress, key), (X.KeyRelease, key)]
        events += [(X.KeyRelease, c) for c in reversed(mods)]
        for kind, code in events:
            xtest.fake_input(self._display, kind, code)
        self._display.sync()

    def _keycode(self, keysym: int) -> int:
        code = self._display.keysym_to_keycode(keysym)
        if not code:
            raise OSError(f"the keyboard layout has no key for keysym {keysym:#x}")
        return code

    def clipboard_change_count(self) -> int | None:
        """How many times the CLIPBOARD changed owner (XFixes), counted since start."""
        if self._changes is None:
            return None
        while self._display.pending_events():
            ev = self._display.next_event()
            if ev.type == self._owner_event and ev.sub_code == xfixes.XFixesSetSelectionOwnerNotify \
                    and ev.selection == self._clipboard_atom:
                self._changes += 1
        return self._changes

    def remember_focus(self) -> object | None:
        focus = self._display.get_input_focus().focus
        return focus if not isinstance(focus, int) else None  # PointerRoot / None come back as ints

    def _client_window(self, window) -> tuple[object, tuple[str, ...]]:
        """The focused window or the nearest ancestor with a WM_CLASS, and that class."""
        try:
            for _ in range(_MAX_PARENTS):
                wm_class = window.get_wm_class()
                if wm_class:
                    return window, tuple(name.lower() for name in wm_class if name)
                parent = window.query_tree().parent
                if not parent or parent.id == self._root.id:
                    break
                window = parent
        except error.XError:  # the window went away meanwhile
            pass
        return window, ()

    def app_ids(self, focus: object | None) -> tuple[str, ...]:
        return self._client_window(focus)[1] if focus is not None else ()

    def restore_focus(self, token: object | None) -> None:
        if token is None or self._closed:  # (a popup closed while the app quits, after close())
            return
        try:
            client, _ids = self._client_window(token)
            # A window manager moves the focus when asked through _NET_ACTIVE_WINDOW (source 2: a
            # pager, which it does not second-guess); without one, SetInputFocus does it.
            ask = xevent.ClientMessage(window=client, client_type=self._display.intern_atom("_NET_ACTIVE_WINDOW"),
                                       data=(32, [2, X.CurrentTime, 0, 0, 0]))
            ignore = error.CatchError()  # the window may be gone by now: then the focus stays where it is
            self._root.send_event(ask, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask,
                                  onerror=ignore)
            token.set_input_focus(X.RevertToParent, X.CurrentTime, onerror=ignore)  # type: ignore[attr-defined]
            self._display.sync()
        except error.XError:
            pass  # the window is gone: the paste goes wherever the focus is

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._display.close()

