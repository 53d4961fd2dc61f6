"""macOS synthetic keys through pynput (Cmd+C / Cmd+V / Cmd+Z)."""

from __future__ import annotations

from pynput.keyboard import Controller, Key

from app.ui.platform.keyinput_base import KeyInjector

_SHORTCUTS = {"copy": "c", "paste": "v", "undo": "z"}


class MacKeyInjector(KeyInjector):
    name = "pynput"

    def __init__(self):
        self._keyboard = Controller()

    def release_modifiers(self) -> None:
        for key in (Key.ctrl, Key.alt, Key.shift, Key.cmd):
            self._keyboard.release(key)

    def send_shortcut(self, action: str) -> None:
        with self._keyboard.pressed(Key.cmd):
            self._keyboard.tap(_SHORTCUTS[action])
