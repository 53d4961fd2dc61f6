"""Hotkey strings ("Ctrl+Alt+S") parsed into a platform-neutral :class:`Hotkey`.

The grammar of a setting's value: the settings check hotkeys with it (no Qt needed); each
platform backend (app/ui/platform) maps the neutral names to its own codes (X11 keysyms,
Windows virtual keys, pynput tokens). A hotkey needs at least one of Ctrl/Alt/Super so a
global grab never steals a plain key the user types.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from app.settings.notices import NoticeError

MODIFIER_ORDER = ("ctrl", "alt", "shift", "super")
# The keys an application copies and pastes with (app/ui/platform/shortcuts.py says which is which);
# a setting names one per application, so the list lives with the grammar, not in the UI.
COPY_STYLES = ("standard", "ctrl_shift", "ctrl_insert", "none")
_MODIFIER_ALIASES = {
    "ctrl": "ctrl", "control": "ctrl", "ctl": "ctrl",
    "alt": "alt", "option": "alt", "opt": "alt",
    "shift": "shift",
    "super": "super", "win": "super", "meta": "super", "cmd": "super", "command": "super",
}
_MODIFIER_LABELS = {"ctrl": "Ctrl", "alt": "Alt", "shift": "Shift", "super": "Super"}

# Named keys: neutral name -> display label. Letters, digits and F1..F24 are added below.
NAMED_KEYS = {
    "space": "Space", "enter": "Enter", "return": "Enter", "tab": "Tab", "escape": "Esc", "esc": "Esc",
    "backspace": "Backspace", "insert": "Insert", "delete": "Delete", "del": "Delete",
    "home": "Home", "end": "End", "pageup": "PageUp", "pagedown": "PageDown",
    "up": "Up", "down": "Down", "left": "Left", "right": "Right",
    "comma": ",", ",": ",", "period": ".", ".": ".", "slash": "/", "/": "/",
    "semicolon": ";", ";": ";", "minus": "-", "-": "-", "equal": "=", "=": "=",
    "backquote": "`", "`": "`", "'": "'", "apostrophe": "'",
    "[": "[", "]": "]", "bracketleft": "[", "bracketright": "]", "\\": "\\", "backslash": "\\",
}
for _c in string.ascii_uppercase + string.digits:
    NAMED_KEYS[_c.lower()] = _c
for _n in range(1, 25):
    NAMED_KEYS[f"f{_n}"] = f"F{_n}"


class HotkeyError(NoticeError):
    """A hotkey string cannot be parsed or is not allowed."""


class HotkeyConflictError(NoticeError):
    """The operating system refused to register a hotkey (another program holds it)."""


@dataclass(frozen=True, slots=True)
class Hotkey:
    modifiers: frozenset[str]  # subset of MODIFIER_ORDER
    key: str  # display label from NAMED_KEYS values, e.g. "S", "Space", "F5", ","

    def __str__(self) -> str:
        mods = [_MODIFIER_LABELS[m] for m in MODIFIER_ORDER if m in self.modifiers]
        return "+".join([*mods, self.key])


def _keys(modifiers: str, keys: str) -> set[Hotkey]:
    return {Hotkey(frozenset(modifiers.split("+")), key) for key in keys.split()}


# Copy, cut, paste, undo, redo and select all, as applications and terminals take them (Cmd is
# Super on macOS), and the Windows console's Ctrl+Insert: the copy and paste the app sends into
# other windows too. Grabbed globally they would stop working everywhere.
_EDITING_KEYS = frozenset(_keys("ctrl", "C V X Z Y A Insert") | _keys("ctrl+shift", "C V X Z")
                          | _keys("super", "C V X Z A") | _keys("super+shift", "Z"))


def parse_hotkey(text: str) -> Hotkey:
    """Parse "Ctrl+Alt+S" (case-insensitive, aliases Win/Meta/Cmd/Option allowed)."""
    raw = text.strip()
    if not raw:
        raise HotkeyError("hotkey is empty")
    # "Ctrl++" would mean the plus key; we do not support it, so split plainly.
    parts = [p.strip() for p in raw.split("+")]
    if any(not p for p in parts):
        raise HotkeyError("hotkey {hotkey!r}: empty part (use names like Ctrl+Alt+S)", hotkey=raw)
    *mod_parts, key_part = parts
    modifiers = set()
    for p in mod_parts:
        mod = _MODIFIER_ALIASES.get(p.lower())
        if mod is None:
            raise HotkeyError("hotkey {hotkey!r}: {part!r} is not a modifier (Ctrl, Alt, Shift, Super)",
                              hotkey=raw, part=p)
        modifiers.add(mod)
    if key_part.lower() in _MODIFIER_ALIASES:
        raise HotkeyError("hotkey {hotkey!r}: ends with a modifier; add a key such as S", hotkey=raw)
    key = NAMED_KEYS.get(key_part.lower())
    if key is None:
        raise HotkeyError("hotkey {hotkey!r}: unknown key {key!r}", hotkey=raw, key=key_part)
    if not modifiers & {"ctrl", "alt", "super"}:
        raise HotkeyError("hotkey {hotkey!r}: needs Ctrl, Alt or Super so it does not steal typing", hotkey=raw)
    hotkey = Hotkey(frozenset(modifiers), key)
    if hotkey in _EDITING_KEYS:
        raise HotkeyError("hotkey {hotkey}: applications copy, paste or undo with it (and Qwen Tray copies "
                          "the selection with it), so it cannot be a global hotkey; choose another", hotkey=hotkey)
    return hotkey


def normalize_hotkey(text: str) -> str:
    """Canonical spelling ("alt+ctrl+s" -> "Ctrl+Alt+S"); empty string stays empty (= no hotkey)."""
    return str(parse_hotkey(text)) if text.strip() else ""
