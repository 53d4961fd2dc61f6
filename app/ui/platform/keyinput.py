"""Synthetic key presses (copy, paste, undo) into the window the user is working in.

One small interface, one backend per platform: Windows ``SendInput``, X11 XTest through
python-xlib, macOS pynput. Before sending Ctrl+C the modifiers of the hotkey the user is
still holding (Alt, Shift…) are released, or the target would see Ctrl+Alt+C.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod


class KeyInjector(ABC):
    name = "none"

    @abstractmethod
    def release_modifiers(self) -> None: ...

    @abstractmethod
    def send_shortcut(self, action: str) -> None:
        """``action`` is "copy", "paste" or "undo": the platform's shortcut for it."""

    # Optional hooks (B027): a backend without a notion of focus keeps these no-ops.
    def remember_focus(self) -> object | None:
        """A token for the focused window, so paste can go back there."""
        return None

    def restore_focus(self, token: object | None) -> None:
        pass

    def close(self) -> None:
        pass


class NoKeyInjector(KeyInjector):
    """Where synthetic keys are impossible: actions then use the clipboard as it is."""

    def __init__(self, reason: str):
        self.reason = reason

    def release_modifiers(self) -> None:
        pass

    def send_shortcut(self, action: str) -> None:
        pass


def create_key_injector() -> KeyInjector:
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
