"""Which keys copy, paste and undo in the window the user is working in.

Most applications use Ctrl+C/V/Z (⌘C/V/Z on macOS). Terminal emulators do not: there
Ctrl+C interrupts the running program and Ctrl+Z suspends it, so they are never sent into
one. Terminals are recognised by the focused window's identifiers (X11 WM_CLASS; Windows
window class and executable name), lowercased; the user can set any application's style
in Settings, which wins over the built-in table.

Styles:
- ``standard``: Ctrl+C / Ctrl+V / Ctrl+Z (⌘ on macOS);
- ``ctrl_shift``: Ctrl+Shift+C / Ctrl+Shift+V, no undo (GNOME Terminal, Konsole, kitty, …);
- ``ctrl_insert``: Ctrl+Insert / Shift+Insert, no undo (the Windows console, mintty);
- ``none``: no keys at all (the selection is read where the platform keeps it, or not at all).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

from app.settings.keys import Hotkey
SHORTCUT_ACTIONS = ("copy", "paste", "undo")

# Lowercased X11 WM_CLASS instance/class names of terminal emulators.
X11_TERMINALS = frozenset({
    "xterm", "uxterm", "urxvt", "rxvt", "rxvt-unicode", "gnome-terminal", "gnome-terminal-server", "konsole",
    "xfce4-terminal", "mate-terminal", "lxterminal", "qterminal", "terminator", "tilix", "alacritty", "kitty",
    "wezterm", "org.wezfurlong.wezterm", "st", "st-256color", "sakura", "terminology", "guake", "tilda",
    "yakuake", "deepin-terminal", "termite", "foot", "footclient", "cool-retro-term", "hyper", "tabby",
    "ptyxis", "org.gnome.ptyxis", "kgx", "org.gnome.console", "blackbox", "com.raggesilver.blackbox",
    "x-terminal-emulator", "eterm", "rio", "warp", "contour", "ghostty", "com.mitchellh.ghostty",
})
# Lowercased Windows window classes and executable names of terminals, with the keys they copy with.
WINDOWS_TERMINALS: Mapping[str, str] = {
    "cascadia_hosting_window_class": "ctrl_shift", "windowsterminal.exe": "ctrl_shift",
    "consolewindowclass": "ctrl_insert", "conhost.exe": "ctrl_insert", "cmd.exe": "ctrl_insert",
    "powershell.exe": "ctrl_insert", "pwsh.exe": "ctrl_insert", "openconsole.exe": "ctrl_insert",
    "mintty": "ctrl_insert", "mintty.exe": "ctrl_insert",
    "alacritty.exe": "ctrl_shift", "wezterm-gui.exe": "ctrl_shift", "kitty.exe": "ctrl_shift",
    "putty": "none", "putty.exe": "none",  # PuTTY copies on select; Ctrl+C goes to the remote shell
}

_CTRL, _SHIFT, _SUPER = frozenset({"ctrl"}), frozenset({"shift"}), frozenset({"super"})
_CHORDS: Mapping[str, Mapping[str, Hotkey]] = {
    "standard": {"copy": Hotkey(_CTRL, "C"), "paste": Hotkey(_CTRL, "V"), "undo": Hotkey(_CTRL, "Z")},
    "ctrl_shift": {"copy": Hotkey(_CTRL | _SHIFT, "C"), "paste": Hotkey(_CTRL | _SHIFT, "V")},
    "ctrl_insert": {"copy": Hotkey(_CTRL, "Insert"), "paste": Hotkey(_SHIFT, "Insert")},
    "none": {},
}
_MAC_CHORDS = {"copy": Hotkey(_SUPER, "C"), "paste": Hotkey(_SUPER, "V"), "undo": Hotkey(_SUPER, "Z")}


def chord_for(action: str, style: str, platform: str = sys.platform) -> Hotkey | None:
    """The key combination for ``action`` ("copy", "paste", "undo") in ``style``; None: none exists."""
    if action not in SHORTCUT_ACTIONS:
        raise ValueError(f"unknown shortcut action {action!r}")
    if style == "standard" and platform == "darwin":
        return _MAC_CHORDS[action]
    return _CHORDS[style].get(action)


def builtin_style(app_ids: Iterable[str], platform: str = sys.platform) -> str:
    """The style the built-in tables give an application, from its lowercased identifiers."""
    ids = [i.lower() for i in app_ids]
    if platform == "win32":
        return next((WINDOWS_TERMINALS[i] for i in ids if i in WINDOWS_TERMINALS), "standard")
    if platform == "darwin":
        return "standard"  # macOS terminals copy with ⌘C too; ⌘C never interrupts a program
    return "ctrl_shift" if any(i in X11_TERMINALS for i in ids) else "standard"


def style_for(app_ids: Iterable[str], overrides: Mapping[str, str], platform: str = sys.platform) -> str:
    """The user's override for any of the application's identifiers, else the built-in style."""
    ids = [i.lower() for i in app_ids]
    chosen = next((overrides[i] for i in ids if i in overrides), None)
    return chosen if chosen is not None else builtin_style(ids, platform)


def is_terminal_style(style: str) -> bool:
    """A style without undo: Ctrl+Z must not be sent, answers are not pasted on their own."""
    return chord_for("undo", style) is None
