"""Windows synthetic keys through ``SendInput``, key state through ``GetAsyncKeyState``,
clipboard changes through ``GetClipboardSequenceNumber``, the focused application through
its window class and executable name (ctypes, every signature declared)."""

from __future__ import annotations

import ctypes
import ntpath
from ctypes import wintypes

from app.settings.keys import Hotkey
from app.ui.platform.hotkeys_win import virtual_key_for
from app.ui.platform.keyinput_base import KeyInjector

INPUT_KEYBOARD, KEYEVENTF_EXTENDEDKEY, KEYEVENTF_KEYUP = 1, 0x0001, 0x0002
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
_MODIFIER_VKS = (0x10, 0x11, 0x12, 0x5B, 0x5C)  # Shift, Ctrl, Alt(Menu), LWin, RWin
_CHORD_MODIFIER_VKS = {"ctrl": 0x11, "shift": 0x10, "alt": 0x12, "super": 0x5B}
# Keys of the navigation block: without the extended flag they arrive as the numeric keypad's.
_EXTENDED_VKS = frozenset({0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x2D, 0x2E, 0x5B, 0x5C})
_KEYBOARD_VKS = range(0x08, 0xFF)  # every key; 0x01-0x07 are mouse buttons


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
        flags = (KEYEVENTF_KEYUP if up else 0) | (KEYEVENTF_EXTENDEDKEY if vk in _EXTENDED_VKS else 0)
        arr[i].u.ki = KEYBDINPUT(vk, 0, flags, 0, 0)
    return arr


def chord_events(chord: Hotkey) -> list[tuple[int, bool]]:
    """(virtual key, is_key_up) for ``chord``: modifiers down, key down and up, modifiers up."""
    mods = [_CHORD_MODIFIER_VKS[m] for m in sorted(chord.modifiers)]
    key = virtual_key_for(chord.key)
    return [(vk, False) for vk in mods] + [(key, False), (key, True)] + [(vk, True) for vk in reversed(mods)]


def _declare(user32, kernel32) -> None:
    """Argument and result types: handles are pointer-sized, ctypes would truncate them to int."""
    user32.GetForegroundWindow.argtypes, user32.GetForegroundWindow.restype = [], wintypes.HWND
    user32.SetForegroundWindow.argtypes, user32.SetForegroundWindow.restype = [wintypes.HWND], wintypes.BOOL
    user32.SendInput.argtypes, user32.SendInput.restype = [wintypes.UINT, ctypes.c_void_p, ctypes.c_int], wintypes.UINT
    user32.GetAsyncKeyState.argtypes, user32.GetAsyncKeyState.restype = [ctypes.c_int], ctypes.c_short
    user32.GetClipboardSequenceNumber.argtypes, user32.GetClipboardSequenceNumber.restype = [], wintypes.DWORD
    user32.GetClassNameW.argtypes = [wintypes.HWND, wintypes.LPWSTR, ctypes.c_int]
    user32.GetClassNameW.restype = ctypes.c_int
    user32.GetWindowThreadProcessId.argtypes = [wintypes.HWND, ctypes.POINTER(wintypes.DWORD)]
    user32.GetWindowThreadProcessId.restype = wintypes.DWORD
    kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.QueryFullProcessImageNameW.argtypes = [wintypes.HANDLE, wintypes.DWORD, wintypes.LPWSTR,
                                                    ctypes.POINTER(wintypes.DWORD)]
    kernel32.QueryFullProcessImageNameW.restype = wintypes.BOOL
    kernel32.CloseHandle.argtypes, kernel32.CloseHandle.restype = [wintypes.HANDLE], wintypes.BOOL


class WindowsKeyInjector(KeyInjector):
    name = "sendinput"

    def __init__(self):
        self._user32 = ctypes.WinDLL("user32", use_last_error=True)  # type: ignore[attr-defined]
        self._kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        _declare(self._user32, self._kernel32)

    def _send(self, presses: list[tuple[int, bool]]) -> None:
        if presses:
            arr = key_events(presses)
            self._user32.SendInput(len(presses), arr, ctypes.sizeof(INPUT))

    def _down(self, vk: int) -> bool:
        return bool(self._user32.GetAsyncKeyState(vk) & 0x8000)

    def keys_held(self) -> bool:
        return any(self._down(vk) for vk in _KEYBOARD_VKS)

    def release_modifiers(self) -> None:
        self._send([(vk, True) for vk in _MODIFIER_VKS if self._down(vk)])

    def send_chord(self, chord: Hotkey) -> None:
        self._send(chord_events(chord))

    def clipboard_change_count(self) -> int | None:
        return int(self._user32.GetClipboardSequenceNumber())

    def remember_focus(self) -> object | None:
        return self._user32.GetForegroundWindow() or None

    def app_ids(self, focus: object | None) -> tuple[str, ...]:
        if not focus:
            return ()
        ids = []
        name = ctypes.create_unicode_buffer(256)
        if self._user32.GetClassNameW(focus, name, len(name)):
            ids.append(name.value.lower())
        exe = self._executable(focus)
        if exe:
            ids.append(ntpath.basename(exe).lower())
        return tuple(ids)

    def _executable(self, hwnd) -> str:
        pid = wintypes.DWORD()
        self._user32.GetWindowThreadProcessId(hwnd, ctypes.byref(pid))
        handle = self._kernel32.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid.value)
        if not handle:
            return ""  # a process of another user or an elevated one: its window class still counts
        try:
            path, size = ctypes.create_unicode_buffer(1024), wintypes.DWORD(1024)
            ok = self._kernel32.QueryFullProcessImageNameW(handle, 0, path, ctypes.byref(size))
            return path.value if ok else ""
        finally:
            self._kernel32.CloseHandle(handle)

    def restore_focus(self, token: object | None) -> None:
        if token:
            self._user32.SetForegroundWindow(token)
