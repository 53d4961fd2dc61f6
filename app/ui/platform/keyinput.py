"""Synthetic key presses (copy, paste, undo) into the window the user is working in.

One small interface, one backend per platform: Windows ``SendInput``, X11 XTest through
python-xlib, macOS pynput. Before sending Ctrl+C the modifiers of the hotkey the user is
still holding (Alt, Shift…) are released, or the target would see Ctrl+Alt+C.
"""

from __future__ import annotations

import os
import sys

from app.ui.platform.keyinput_base import KeyInjector, NoKeyInjector


def create_key_injector() -> KeyInjector:
    # each backend is imported on its own platform only (win32 ctypes, pynput, python-xlib)
    if sys.platform == "win32":
        from app.ui.platform.keyinput_win import WindowsKeyInjector

        return WindowsKeyInjector()
    if sys.platform == "darwin":
        try:
            from app.ui.platform.keyinput_mac import MacKeyInjector
        except ImportError as e:
            return NoKeyInjector(f"pynput is not installed ({e})")
        return MacKeyInjector()
    if not os.environ.get("DISPLAY"):
        return NoKeyInjector("no X display")
    try:
        from app.ui.platform.keyinput_x11 import X11KeyInjector

        return X11KeyInjector()
    except ImportError as e:
        return NoKeyInjector(f"python-xlib is not installed ({e})")
    except OSError as e:
        return NoKeyInjector(f"cannot connect to the X display ({e})")
