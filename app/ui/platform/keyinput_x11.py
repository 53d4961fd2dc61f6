"""X11 synthetic keys through the XTest extension (python-xlib)."""

from __future__ import annotations

import os

from Xlib import XK, X, display
from Xlib.ext import xtest

from app.ui.platform.keyinput_base import KeyInjector

_SHORTCUTS = {"copy": "c", "paste": "v", "undo": "z"}
_MODIFIER_KEYSYMS = ("Control_L", "Control_R", "Alt_L", "Alt_R", "Shift_L", "Shift_R",
                     "Super_L", "Super_R", "Meta_L", "Meta_R", "ISO_Level3_Shift")


class X11KeyInjector(KeyInjector):
    name = "xtest"

    def __init__(self):
        self._display = display.Display(os.environ.get("DISPLAY"))
        if not self._display.has_extension("XTEST"):
            self._display.close()
            raise OSError("the X server has no XTEST extension")
        self._modifier_codes = sorted({
            code for name in _MODIFIER_KEYSYMS
            if (code := self._display.keysym_to_keycode(XK.string_to_keysym(name)))
        })

    def _pressed(self, keycode: int) -> bool:
        keymap = self._display.query_keymap()  # 32 bytes, one bit per keycode
        return bool(keymap[keycode // 8] & (1 << (keycode % 8)))

    def release_modifiers(self) -> None:
        for code in self._modifier_codes:
            if self._pressed(code):
                xtest.fake_input(self._display, X.KeyRelease, code)
        self._display.sync()

    def send_shortcut(self, action: str) -> None:
        ctrl = self._display.keysym_to_keycode(XK.string_to_keysym("Control_L"))
        key = self._display.keysym_to_keycode(XK.string_to_keysym(_SHORTCUTS[action]))
        for kind, code in ((X.KeyPress, ctrl), (X.KeyPress, key), (X.KeyRelease, key), (X.KeyRelease, ctrl)):
            xtest.fake_input(self._display, kind, code)
        self._display.sync()

    def remember_focus(self) -> object | None:
        focus = self._display.get_input_focus().focus
        return focus if not isinstance(focus, int) else None  # PointerRoot / None come back as ints

    def restore_focus(self, token: object | None) -> None:
        if token is None:
            return
        token.set_input_focus(X.RevertToParent, X.CurrentTime)  # type: ignore[attr-defined]
        self._display.sync()

    def close(self) -> None:
        self._display.close()
