"""Global hotkeys behind one small interface, one backend per platform.

- Windows: ``RegisterHotKey`` through ctypes; ``WM_HOTKEY`` arrives through Qt's native
  event filter (no low-level keyboard hook).
- X11: ``XGrabKey`` on the root window through python-xlib; a grab another client holds
  comes back as ``BadAccess`` and is reported.
- macOS: pynput's ``GlobalHotKeys`` (macOS cannot tell us about conflicts).

Backends call ``on_activate(binding_id)`` from any thread; :class:`HotkeyManager` turns
that into a Qt signal delivered on the UI thread.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.settings.keys import Hotkey, HotkeyConflictError, HotkeyError, parse_hotkey
from app.ui.i18n import notice_text
from app.ui.platform.hotkeys_base import HotkeyBackend, UnavailableHotkeys


def create_hotkey_backend(on_activate: Callable[[str], None]) -> HotkeyBackend:
    """The backend for this platform, or UnavailableHotkeys saying why none works."""
    # each backend is imported on its own platform only (win32 ctypes, pynput, python-xlib)
    if sys.platform == "win32":
        from app.ui.platform.hotkeys_win import WindowsHotkeys

        return WindowsHotkeys(on_activate)
    if sys.platform == "darwin":
        from app.ui.platform.hotkeys_mac import PynputHotkeys

        try:
            return PynputHotkeys(on_activate)
        except ImportError as e:
            return UnavailableHotkeys(on_activate, f"pynput is not installed ({e})")
    if not os.environ.get("DISPLAY"):
        return UnavailableHotkeys(on_activate,
                                  "no X display (DISPLAY is not set; Wayland-only sessions are not supported)")
    try:
        from app.ui.platform.hotkeys_x11 import X11Hotkeys

        return X11Hotkeys(on_activate)
    except ImportError as e:
        return UnavailableHotkeys(on_activate, f"python-xlib is not installed ({e})")
    except OSError as e:  # cannot open the display
        return UnavailableHotkeys(on_activate, f"cannot connect to the X display ({e})")


class HotkeyManager(QObject):
    """Applies a set of bindings (id -> "Ctrl+Alt+S") and reports which ones failed and why."""

    activated = Signal(str)

    def __init__(self, backend_factory: Callable[[Callable[[str], None]], HotkeyBackend] = create_hotkey_backend,
                 parent: QObject | None = None):
        super().__init__(parent)
        # Emitting a signal is thread-safe; the queued connection delivers it on the UI thread.
        self._backend = backend_factory(self.activated.emit)
        self.failures: dict[str, str] = {}
        self.active: dict[str, str] = {}
        self._bindings: dict[str, str] = {}
        self._suspended = False

    @property
    def backend_name(self) -> str:
        return self._backend.name

    def apply(self, bindings: dict[str, str]) -> dict[str, str]:
        """Re-register everything; returns {binding_id: reason} for the ones not registered."""
        self._backend.unregister_all()
        self._bindings, self._suspended = dict(bindings), False
        self.failures, self.active = {}, {}
        taken: dict[Hotkey, str] = {}
        for binding_id, text in bindings.items():
            if not text.strip():
                continue
            try:
                hotkey = parse_hotkey(text)
                if hotkey in taken:
                    raise HotkeyConflictError("{hotkey} is already used by {binding!r}", hotkey=hotkey,
                                              binding=taken[hotkey])
                self._backend.register(binding_id, hotkey)
            except (HotkeyError, HotkeyConflictError) as e:
                self.failures[binding_id] = notice_text(e.notice)  # shown in Settings and a notice
                continue
            taken[hotkey] = binding_id
            self.active[binding_id] = str(hotkey)
        return dict(self.failures)

    def suspend(self) -> None:
        """Let go of every grab while a hotkey is being recorded in Settings: the keys must reach the
        field, not run an action (whose copy step would send Ctrl+C into the field)."""
        if not self._suspended:
            self._backend.unregister_all()
            self._suspended = True

    def resume(self) -> None:
        """Grab the bindings again after :meth:`suspend` (a no-op otherwise)."""
        if self._suspended:
            self.apply(self._bindings)

    def close(self) -> None:
        self._backend.close()
