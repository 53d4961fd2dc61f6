"""The settings as a command-line command uses them: every notice printed to stderr at once.

A command that reads the settings tells the user, on one line each, what was wrong with the
file and where a broken one went; it then goes on with what could be used.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.errors import QwenTrayError
from app.settings.document import ModelLocation
from app.settings.notices import Notice
from app.settings.store import SettingsStore


def print_notice(notice: Notice) -> None:
    print(f"qwen-tray: {notice}", file=sys.stderr)


def console_store(*, every_notice: bool = False) -> SettingsStore:
    """``every_notice``: also what was told at an earlier command (SettingsStore)."""
    return SettingsStore(on_notice=print_notice, every_notice=every_notice)


def locate_model(name_or_path: str | None) -> ModelLocation:
    """The model a command runs (``--model``, or the default), as :meth:`Settings.locate_model`;
    with no default because the settings file cannot be used, the error says how to fix the file
    (registering the starter model would fail the same way)."""
    store = console_store()
    settings = store.load()
    if name_or_path is None and settings.default_model is None and (blocked := store.cannot_register()):
        raise QwenTrayError(f"no model configured: {blocked}; or pass --model PATH")
    unknown = name_or_path is not None and settings.model(name_or_path) is None
    if unknown and not Path(name_or_path).expanduser().exists() and (unread := store.unread_model(name_or_path)):
        raise unread  # not "no registered model has that name": the file it may be in could not be read
    return settings.locate_model(name_or_path)
