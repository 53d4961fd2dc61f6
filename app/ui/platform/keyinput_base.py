"""The interface every key-sending backend implements (keyinput_win/_x11/_mac), and the one
used where none works. Apart from the factory in keyinput.py, which imports the backends."""

from __future__ import annotations

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
