"""Atomic JSON files: write to a temp file beside the target, then ``os.replace``.

A crash mid-write leaves either the old file or the new one, never half of one. A file
that does not parse is moved aside (``name.corrupt-<n>.json``) so the caller can start
from defaults without losing what was there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from app.paths import atomic_write_text


class CorruptFileError(Exception):
    """Internal signal: the file existed but was not valid JSON of the expected shape."""


def write_json_atomic(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, ensure_ascii=False, indent=2))


def read_json(path: Path) -> Any:
    """Parsed JSON, or ``None`` when the file does not exist; raises CorruptFileError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path}: {e}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path}: {e}") from e


def back_up_corrupt(path: Path) -> Path:
    """Move a broken file aside under a free name and return where it went."""
    n = 1
    while True:
        backup = path.with_name(f"{path.stem}.corrupt-{n}{path.suffix}")
        if not backup.exists():
            os.replace(path, backup)
            return backup
        n += 1
