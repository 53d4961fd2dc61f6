"""macOS synthetic keys through pynput (⌘C / ⌘V / ⌘Z); key state, pasteboard changes and the
frontmost application through :mod:`app.ui.platform.macos_native`."""

from __future__ import annotations

from pynput.keyboard import Controller, Key

from app.settings.keys import Hotkey
from app.ui.platform.keyinput_base import KeyInjector
from app.ui.platform.macos_native import MacNative

_MODIFIERS = {"ctrl": Key.ctrl, "alt": Key.alt, "shift": Key.shift, "super": Key.cmd}
_NAMED = {"Delete": Key.delete, "Space": Key.space, "Enter": Key.enter, "Tab": Key.tab}


class MacKeyInjector(KeyInjector):
    name = "pynput"

    def __init__(self):
        self._keyboard = Controller()
        self._native = MacNative()

    def release_modifiers(self) -> None:
        for key in _MODIFIERS.values():
            self._keyboard.release(key)

    def send_chord(self, chord: Hotkey) -> None:
        key = _NAMED.get(chord.key, chord.key.lower() if len(chord.key) == 1 else None)
        if key is None:
            return  # a key Macs do not have (Insert): a style the user chose for another platform
        with self._keyboard.pressed(*(_MODIFIERS[m] for m in sorted(chord.modifiers))):
            self._keyboard.tap(key)

    def keys_held(self) -> bool:
        return self._native.any_key_down()

    def clipboard_change_count(self) -> int | None:
        return self._native.pasteboard_change_count()

    def remember_focus(self) -> object | None:
        return self._native.frontmost_bundle_id() or None

    def app_ids(self, focus: object | None) -> tuple[str, ...]:
        return (str(focus).lower(),) if focus else ()
