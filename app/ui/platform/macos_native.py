"""macOS key state (Quartz ``CGEventSourceKeyState``), the pasteboard's ``changeCount`` and the
frontmost application's bundle identifier (AppKit), through ctypes: no PyObjC dependency.

``objc_msgSend`` is called through one prototype per result type, as its C declaration
requires on arm64.
"""

from __future__ import annotations

import ctypes
import ctypes.util

HID_SYSTEM_STATE = 1  # kCGEventSourceStateHIDSystemState: the keys as the hardware reports them
KEYCODES = range(128)  # virtual key codes of every key on Apple keyboards


def _library(name: str) -> ctypes.CDLL:
    path = ctypes.util.find_library(name)
    if path is None:
        raise OSError(f"the {name} framework is not available")
    return ctypes.cdll.LoadLibrary(path)


class MacNative:
    def __init__(self):
        self._quartz = _library("ApplicationServices")
        self._quartz.CGEventSourceKeyState.argtypes = [ctypes.c_int32, ctypes.c_uint16]
        self._quartz.CGEventSourceKeyState.restype = ctypes.c_bool
        objc = _library("objc")
        _library("AppKit")  # registers NSPasteboard and NSWorkspace with the runtime
        objc.objc_getClass.argtypes, objc.objc_getClass.restype = [ctypes.c_char_p], ctypes.c_void_p
        objc.sel_registerName.argtypes, objc.sel_registerName.restype = [ctypes.c_char_p], ctypes.c_void_p
        self._objc = objc
        self._send_id = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(("objc_msgSend", objc))
        self._send_long = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p)(("objc_msgSend", objc))
        self._send_str = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p)(("objc_msgSend", objc))

    def _sel(self, name: str) -> int:
        return self._objc.sel_registerName(name.encode())

    def _class_call(self, cls: str, selector: str) -> int | None:
        return self._send_id(self._objc.objc_getClass(cls.encode()), self._sel(selector))

    def any_key_down(self) -> bool:
        return any(self._quartz.CGEventSourceKeyState(HID_SYSTEM_STATE, code) for code in KEYCODES)

    def pasteboard_change_count(self) -> int:
        pasteboard = self._class_call("NSPasteboard", "generalPasteboard")
        return int(self._send_long(pasteboard, self._sel("changeCount")))

    def frontmost_bundle_id(self) -> str:
        workspace = self._class_call("NSWorkspace", "sharedWorkspace")
        app = self._send_id(workspace, self._sel("frontmostApplication"))
        ident = self._send_id(app, self._sel("bundleIdentifier")) if app else None
        text = self._send_str(ident, self._sel("UTF8String")) if ident else None
        return text.decode() if text else ""
