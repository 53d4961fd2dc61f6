"""The settings' files on disk: one way to write them, one way to treat a broken or unreadable one.

- Written atomically (``app.paths.atomic_write_text``: a temp file beside the target, then a
  rename): a crash leaves the old file or the new one, never half of one. On Windows the rename
  is tried again for about a second while another program holds the file open; past that the
  error says the file is in use, not that its folder should be made writable.
- *Corrupt* (not JSON, or not the shape its reader expects): moved aside to a name no other
  file has, ``NAME.corrupt-YYYYMMDD-HHMMSS.json`` (then ``-2``, ``-3``, ...). The name is
  reserved with an exclusive create before the move, so two resets in the same second, or in
  two processes, never overwrite an earlier backup. The reader starts from defaults and tells
  the user where the file went.
- *Unreadable* (permission denied, a folder in its place, an I/O error): left exactly as it
  is, never taken for corrupt. The reader uses defaults for this run and must not write over
  it (:class:`SettingsFileError` says so when something tries).

The chat history (app/ui/history.py) follows the same policy with these functions.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import QwenTrayError
from app.paths import FileInUseError, atomic_write_text

MISSING, OK, CORRUPT, UNREADABLE = "missing", "ok", "corrupt", "unreadable"
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class SettingsFileError(QwenTrayError):
    """A settings file cannot be written, or must not be (it could not be read); one sentence."""


@dataclass(frozen=True)
class JsonRead:
    """What reading a JSON file found: ``state`` is MISSING, OK, CORRUPT or UNREADABLE."""

    state: str
    data: Any = None
    problem: str = ""  # why it is corrupt or unreadable, in words


def read_json(path: Path) -> JsonRead:
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return JsonRead(MISSING)
    except OSError as e:
        return JsonRead(UNREADABLE, problem=os_reason(e))
    try:
        return JsonRead(OK, json.loads(raw.decode("utf-8")))
    except UnicodeDecodeError as e:
        return JsonRead(CORRUPT, problem=f"not UTF-8 text ({e.reason} at byte {e.start})")
    except (ValueError, RecursionError) as e:  # JSONDecodeError; a 5,000-digit number; nesting too deep
        return JsonRead(CORRUPT, problem=f"not valid JSON ({e})")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON, atomically; SettingsFileError names the file and what to do."""
    text = json.dumps(data, ensure_ascii=False, indent=2) + "\n"
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise cannot_write(path, e) from None


def cannot_write(path: Path, e: OSError) -> SettingsFileError:
    """The one-sentence error for a file that could not be written: the file, why, and what to do."""
    return SettingsFileError(f"cannot save {path}: {os_reason(e)}; {_remedy(path, e)}")


def keep_aside(path: Path, label: str = "corrupt", *, copy: bool = False) -> Path:
    """Move (or copy) ``path`` to ``STEM.LABEL-YYYYMMDD-HHMMSS[-N]SUFFIX`` beside it; never overwrites.

    ``label`` says why: "corrupt", "invalid" (a file some values of which were left out, copied
    before it is rewritten), "v1-backup" (a file of an earlier version, after migration).
    Returns the new name; raises OSError when the folder does not let it happen."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        target = path.with_name(f"{path.stem}.{label}-{stamp}{'' if n == 1 else f'-{n}'}{path.suffix}")
        try:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # the name is ours now
        except FileExistsError:
            continue
        try:
            if copy:
                shutil.copyfile(path, target)
            else:
                os.replace(path, target)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return target
    raise AssertionError("unreachable")


def os_reason(e: OSError) -> str:
    """An OSError in words, without the file name the caller already gives ("Permission denied")."""
    return e.strerror or str(e)


def _remedy(path: Path, e: OSError) -> str:
    if isinstance(e, FileInUseError):  # its folder is writable: making it so would be wrong advice
        return ("close the program that has it open (a second Qwen Tray, an editor), or clear its read-only "
                "attribute, then try again")
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        return f"{blocker} is a file where a folder should be; move it away"
    if e.errno in _NOT_WRITABLE:
        return f"make {path.parent} writable, or set QWEN_TRAY_HOME to a writable folder"
    if e.errno in _NO_SPACE:
        return f"free some space on the disk of {path.parent}"
    return f"check {path.parent}"
