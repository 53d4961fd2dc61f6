"""The interface every key-sending backend implements (keyinput_win/_x11/_mac), and the one
used where none works. Apart from the factory in keyinput.py, which imports the backends."""

from __future__ import annotations

from abc import ABC, abstractmethod

from app.settings.keys import Hotkey
from app.ui.platform.shortcuts import chord_for


class KeyInjector(ABC):
    name = "none"
    can_send_keys = True  # False: a copy cannot be asked for; actions use what is already there

    @abstractmethod
    def release_modifiers(self) -> None:
        """Release any modifier still held, so the target does not see Ctrl+Alt+C for Ctrl+C."""

    @abstractmethod
    def send_chord(self, chord: Hotkey) -> None:
        """Press ``chord``'s modifiers, tap its key, release the modifiers."""

    def send_shortcut(self, action: str, style: str = "standard") -> bool:
        """Send the "copy", "paste" or "undo" keys of ``style``; False when the style has none."""
        chord = chord_for(action, style)
        if chord is None:
            return False
        self.send_chord(chord)
        return True

    # Optional hooks (B027): a backend that cannot tell keeps these answers.
    def keys_held(self) -> bool:
        """True while any key is down (the user is still pressing the hotkey)."""
        return False

    def clipboard_change_count(self) -> int | None:
        """A number that changes whenever anything is put on the clipboard; None where unknown."""
        return None

    def remember_focus(self) -> object | None:
        """A token for the focused window, so paste can go back there."""
        return None

    def app_ids(self, focus: object | None) -> tuple[str, ...]:
        """Lowercased names of the application owning ``focus`` (WM_CLASS, window class, program)."""
        return ()

    def restore_focus(self, token: object | None) -> None:
        pass

    def close(self) -> None:
        pass


class NoKeyInjector(KeyInjector):
    """Where synthetic keys are impossible: actions then use the clipboard as it is."""

    can_send_keys = False

    def __init__(self, reason: str):
        self.reason = reason

    def release_modifiers(self) -> None:
        pass

    def send_chord(self, chord: Hotkey) -> None:
        pass
