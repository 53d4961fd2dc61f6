"""The interface every global-hotkey backend implements (hotkeys_win/_x11/_mac), and the one
used where none works. Apart from the factory in hotkeys.py, which imports the backends."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from app.settings.keys import Hotkey, HotkeyConflictError


class HotkeyBackend(ABC):
    """Registers system-wide hotkeys for one platform."""

    name = "none"

    def __init__(self, on_activate: Callable[[str], None]):
        self._on_activate = on_activate

    @abstractmethod
    def register(self, binding_id: str, hotkey: Hotkey) -> None:
        """Grab ``hotkey``; raise HotkeyConflictError when the OS refuses it."""

    @abstractmethod
    def unregister_all(self) -> None: ...

    def close(self) -> None:
        self.unregister_all()


class UnavailableHotkeys(HotkeyBackend):
    """Used where no backend works (Wayland without X, missing library): every hotkey is reported."""

    def __init__(self, on_activate: Callable[[str], None], reason: str):
        super().__init__(on_activate)
        self.reason = reason

    def register(self, binding_id: str, hotkey: Hotkey) -> None:
        raise HotkeyConflictError("global hotkeys are unavailable: {reason}", reason=self.reason)

    def unregister_all(self) -> None:
        pass
