"""Synthetic key presses (copy, paste, undo) into the window the user is working in, and
what a copy needs to know about that window and the keyboard.

One small interface (:mod:`app.ui.platform.keyinput_base`), one backend per platform:
Windows ``SendInput``, X11 XTest through python-xlib, macOS pynput (plus Quartz through
ctypes for the key state). Before a copy the hotkey the user is pressing must be up
(:meth:`KeyInjector.keys_held`): on X11 a key sent while the hotkey's own key is held goes
to the program that grabbed the hotkey, not to the focused window. The keys themselves
follow the focused application (:mod:`app.ui.platform.shortcuts`): terminals never get Ctrl+C.
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

            return MacKeyInjector()
        except ImportError as e:
            return NoKeyInjector(f"pynput is not installed ({e})")
        except OSError as e:  # Quartz/AppKit could not be loaded through ctypes
            return NoKeyInjector(str(e))
    if not os.environ.get("DISPLAY"):
        return NoKeyInjector("no X display")
    try:
        from app.ui.platform.keyinput_x11 import X11KeyInjector

        return X11KeyInjector()
    except ImportError as e:
        return NoKeyInjector(f"python-xlib is not installed ({e})")
    except OSError as e:
        return NoKeyInjector(f"cannot connect to the X display ({e})")
