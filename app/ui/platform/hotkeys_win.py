"""Windows global hotkeys: ``RegisterHotKey`` + ``WM_HOTKEY`` read by Qt's native event filter.

``RegisterHotKey(NULL, id, ...)`` posts ``WM_HOTKEY`` to this (the UI) thread's queue; Qt's
event dispatcher hands every message to native event filters first, so no window and no
keyboard hook are needed. ``ERROR_HOTKEY_ALREADY_REGISTERED`` means another program has it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from PySide6.QtCore import QAbstractNativeEventFilter, QCoreApplication

from app.settings.keys import Hotkey, HotkeyConflictError, HotkeyError
from app.ui.platform.hotkeys_base import HotkeyBackend

WM_HOTKEY = 0x0312
MOD_ALT, MOD_CONTROL, MOD_SHIFT, MOD_WIN, MOD_NOREPEAT = 0x1, 0x2, 0x4, 0x8, 0x4000
ERROR_HOTKEY_ALREADY_REGISTERED = 1409
_MODS = {"ctrl": MOD_CONTROL, "alt": MOD_ALT, "shift": MOD_SHIFT, "super": MOD_WIN}
_VK_NAMED = {
    "Space": 0x20, "Enter": 0x0D, "Tab": 0x09, "Esc": 0x1B, "Backspace": 0x08, "Insert": 0x2D,
    "Delete": 0x2E, "Home": 0x24, "End": 0x23, "PageUp": 0x21, "PageDown": 0x22,
    "Up": 0x26, "Down": 0x28, "Left": 0x25, "Right": 0x27,
    ",": 0xBC, ".": 0xBE, "/": 0xBF, ";": 0xBA, "-": 0xBD, "=": 0xBB, "`": 0xC0, "'": 0xDE,
    "[": 0xDB, "]": 0xDD, "\\": 0xDC,
}


class MSG(ctypes.Structure):
    """The start of Win32's MSG with fixed-width fields (ctypes.wintypes' are 8 bytes off Windows)."""

    _fields_ = [("hwnd", ctypes.c_void_p), ("message", ctypes.c_uint32), ("wParam", ctypes.c_size_t),
                ("lParam", ctypes.c_ssize_t), ("time", ctypes.c_uint32), ("pt_x", ctypes.c_int32),
                ("pt_y", ctypes.c_int32)]


def virtual_key_for(key: str) -> int:
    """Windows virtual-key code of a neutral key label."""
    if key in _VK_NAMED:
        return _VK_NAMED[key]
    if len(key) == 1 and (key.isdigit() or "A" <= key <= "Z"):
        return ord(key)  # VK_0..VK_9 and VK_A..VK_Z equal their ASCII codes
    if key.startswith("F") and key[1:].isdigit() and 1 <= int(key[1:]) <= 24:
        return 0x70 + int(key[1:]) - 1  # VK_F1 = 0x70
    raise HotkeyError("key {key!r} has no Windows virtual-key code", key=key)


def modifier_flags(hotkey: Hotkey) -> int:
    flags = MOD_NOREPEAT  # one WM_HOTKEY per press, not one per auto-repeat
    for m in hotkey.modifiers:
        flags |= _MODS[m]
    return flags


class _HotkeyFilter(QAbstractNativeEventFilter):
    def __init__(self, on_hotkey: Callable[[int], None]):
        super().__init__()
        self._on_hotkey = on_hotkey

    def nativeEventFilter(self, event_type, message):  # noqa: N802 (Qt's name)
        if bytes(event_type) == b"windows_generic_MSG":
            msg = MSG.from_address(int(message))
            if msg.message == WM_HOTKEY:
                self._on_hotkey(int(msg.wParam))
                return True, 0
        return False, 0


class WindowsHotkeys(HotkeyBackend):
    name = "windows"

    def __init__(self, on_activate: Callable[[str], None]):
        super().__init__(on_activate)
        self._user32 = ctypes.WinDLL("user32", use_last_error=True)  # type: ignore[attr-defined]
        from ctypes import wintypes

        self._user32.RegisterHotKey.argtypes = [wintypes.HWND, ctypes.c_int, wintypes.UINT, wintypes.UINT]
        self._user32.RegisterHotKey.restype = wintypes.BOOL
        self._user32.UnregisterHotKey.argtypes = [wintypes.HWND, ctypes.c_int]
        self._ids: dict[int, str] = {}
        self._next_id = 1
        self._filter = _HotkeyFilter(self._dispatch)
        QCoreApplication.instance().installNativeEventFilter(self._filter)

    def _dispatch(self, hotkey_id: int) -> None:
        binding_id = self._ids.get(hotkey_id)
        if binding_id is not None:
            self._on_activate(binding_id)

    def register(self, binding_id: str, hotkey: Hotkey) -> None:
        hotkey_id = self._next_id
        if not self._user32.RegisterHotKey(None, hotkey_id, modifier_flags(hotkey), virtual_key_for(hotkey.key)):
            code = ctypes.get_last_error()  # type: ignore[attr-defined]
            if code == ERROR_HOTKEY_ALREADY_REGISTERED:
                raise HotkeyConflictError("hotkey {hotkey} is already taken by another program", hotkey=hotkey)
            raise HotkeyConflictError("hotkey {hotkey}: Windows refused it (error {code})", hotkey=hotkey, code=code)
        self._next_id += 1
        self._ids[hotkey_id] = binding_id

    def unregister_all(self) -> None:
        for hotkey_id in self._ids:
            self._user32.UnregisterHotKey(None, hotkey_id)
        self._ids.clear()

    def close(self) -> None:
        self.unregister_all()
        app = QCoreApplication.instance()
        if app is not None:
            app.removeNativeEventFilter(self._filter)
