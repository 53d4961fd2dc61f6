"""Windows synthetic keys through ``SendInput`` (ctypes)."""

from __future__ import annotations

import ctypes
from ctypes import wintypes

from app.ui.platform.keyinput_base import KeyInjector

INPUT_KEYBOARD, KEYEVENTF_KEYUP = 1, 0x0002
VK_CONTROL = 0x11
_MODIFIER_VKS = (0x10, 0x11, 0x12, 0x5B, 0x5C)  # Shift, Ctrl, Alt(Menu), LWin, RWin
_SHORTCUTS = {"copy": ord("C"), "paste": ord("V"), "undo": ord("Z")}


# Fixed-width types (not ctypes.wintypes, whose DWORD/LONG are 8 bytes off Windows), so the
# layout is Windows' on any 64-bit machine and the tests can check it: sizeof(INPUT) == 40.
_WORD, _DWORD, _LONG, _ULONG_PTR = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t


class KEYBDINPUT(ctypes.Structure):
    _fields_ = [("wVk", _WORD), ("wScan", _WORD), ("dwFlags", _DWORD), ("time", _DWORD),
                ("dwExtraInfo", _ULONG_PTR)]


class _MOUSEINPUT(ctypes.Structure):  # only here so the union has the size Windows expects
    _fields_ = [("dx", _LONG), ("dy", _LONG), ("mouseData", _DWORD), ("dwFlags", _DWORD), ("time", _DWORD),
                ("dwExtraInfo", _ULONG_PTR)]


class _INPUTUNION(ctypes.Union):
    _fields_ = [("ki", KEYBDINPUT), ("mi", _MOUSEINPUT)]


class INPUT(ctypes.Structure):
    _fields_ = [("type", _DWORD), ("u", _INPUTUNION)]


def key_events(presses: list[tuple[int, bool]]) -> ctypes.Array:
    """An INPUT array: (virtual key, is_key_up) in order."""
    arr = (INPUT * len(presses))()
    for i, (vk, up) in enumerate(presses):
        arr[i].type = INPUT_KEYBOARD
        arr[i].u.ki = KEYBDINPUT(vk, 0, KEYEVENTF_KEYUP if up else 0, 0, 0)
    return arr


class WindowsKeyInjector(KeyInjector):
    name = "sendinput"

    def __init__(self):
        self._user32 = ctypes.WinDLL("user32", use_last_error=True)  # type: ignore[attr-defined]
        # Window handles are pointer-sized: without argtypes ctypes would truncate them to int.
        self._user32.GetForegroundWindow.restype = wintypes.HWND
        self._user32.SetForegroundWindow.argtypes = [wintypes.HWND]
        self._user32.SendInput.argtypes = [wintypes.UINT, ctypes.c_void_p, ctypes.c_int]
        self._user32.GetAsyncKeyState.argtypes = [ctypes.c_int]
        self._user32.GetAsyncKeyState.restype = ctypes.c_short

    def _send(self, presses: list[tuple[int, bool]]) -> None:
        if presses:
            arr = key_events(presses)
            self._user32.SendInput(len(presses), arr, ctypes.sizeof(INPUT))

    def release_modifiers(self) -> None:
        held = [vk for vk in _MODIFIER_VKS if self._user32.GetAsyncKeyState(vk) & 0x8000]
        self._send([(vk, True) for vk in held])

    def send_shortcut(self, action: str) -> None:
        key = _SHORTCUTS[action]
        self._send([(VK_CONTROL, False), (key, False), (key, True), (VK_CONTROL, True)])

    def remember_focus(self) -> object | None:
        return self._user32.GetForegroundWindow() or None

    def restore_focus(self, token: object | None) -> None:
        if token:
            self._user32.SetForegroundWindow(token)
