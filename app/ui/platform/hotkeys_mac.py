"""macOS global hotkeys through pynput's ``GlobalHotKeys`` (needs the Accessibility permission).

macOS offers no way to learn that another program uses the same combination, so nothing
is reported as a conflict here; Settings says so.
"""

from __future__ import annotations

from collections.abc import Callable

from app.settings.keys import Hotkey
from app.ui.platform.hotkeys_base import HotkeyBackend

_MOD_TOKENS = {"ctrl": "<ctrl>", "alt": "<alt>", "shift": "<shift>", "super": "<cmd>"}
_KEY_TOKENS = {
    "Space": "<space>", "Enter": "<enter>", "Tab": "<tab>", "Esc": "<esc>", "Backspace": "<backspace>",
    "Delete": "<delete>", "Home": "<home>", "End": "<end>", "PageUp": "<page_up>", "PageDown": "<page_down>",
    "Up": "<up>", "Down": "<down>", "Left": "<left>", "Right": "<right>", "Insert": "<insert>",
}


def pynput_combo(hotkey: Hotkey) -> str:
    """pynput's spelling, e.g. "<ctrl>+<alt>+s"."""
    mods = [_MOD_TOKENS[m] for m in ("ctrl", "alt", "shift", "super") if m in hotkey.modifiers]
    key = _KEY_TOKENS.get(hotkey.key)
    if key is None:
        key = f"<{hotkey.key.lower()}>" if hotkey.key.startswith("F") and len(hotkey.key) > 1 else hotkey.key.lower()
    return "+".join([*mods, key])


class PynputHotkeys(HotkeyBackend):
    name = "pynput"

    def __init__(self, on_activate: Callable[[str], None]):
        super().__init__(on_activate)
        from pynput import keyboard  # here, not at import: pynput needs a display even to import

        self._keyboard = keyboard
        self._combos: dict[str, str] = {}
        self._listener = None

    def register(self, binding_id: str, hotkey: Hotkey) -> None:
        self._combos[pynput_combo(hotkey)] = binding_id
        self._restart()

    def unregister_all(self) -> None:
        self._combos.clear()
        self._restart()

    def _restart(self) -> None:
        if self._listener is not None:
            self._listener.stop()
            self._listener = None
        if self._combos:
            handlers = {combo: (lambda b=b: self._on_activate(b)) for combo, b in self._combos.items()}
            self._listener = self._keyboard.GlobalHotKeys(handlers)
            self._listener.start()
