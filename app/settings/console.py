"""The settings as a command-line command uses them: every notice printed to stderr at once.

A command that reads the settings tells the user, on one line each, what was wrong with the
file and where a broken one went; it then goes on with what could be used.
"""

from __future__ import annotations

import sys

from app.settings.notices import Notice
from app.settings.store import SettingsStore


def print_notice(notice: Notice) -> None:
    print(f"qwen-tray: {notice}", file=sys.stderr)


def console_store() -> SettingsStore:
    return SettingsStore(on_notice=print_notice)
