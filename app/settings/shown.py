"""Notices a user needs to read once, not at every command (API keys that stay in the settings
file as plain text): which were shown, in a small file under the app's data folder.

A notice is remembered by its whole text, so a change (another model's key, another reason)
is shown again. Where the file cannot be read or written, the notice is shown: better said
again than never.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.paths import data_dir
from app.settings.jsonfile import OK, SettingsFileError, read_json, write_json

log = logging.getLogger(__name__)
FILE_NAME = "notices-shown.json"
MAX_REMEMBERED = 50  # the newest; an old text is at worst shown once more


def shown_file() -> Path:
    return data_dir() / FILE_NAME


def first_showing(text: str, path: Path | None = None) -> bool:
    """True the first time ``text`` is asked about (it is then remembered), False after that."""
    path = path or shown_file()
    read = read_json(path)
    shown = read.data.get("shown") if read.state == OK and isinstance(read.data, dict) else None
    shown = [s for s in shown if isinstance(s, str)] if isinstance(shown, list) else []
    if text in shown:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"shown": [*shown, text][-MAX_REMEMBERED:]})
    except (OSError, SettingsFileError) as e:
        log.info("notice shown again next time: %s", e)
    return True
