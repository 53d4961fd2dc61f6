"""A model folder that could not be written, in the words of one sentence: why (the disk is full,
the folder is not writable, a name is too long) and what to do about it. The quantizer's
checkpoints and the GGUF conversions say it the same way; the caller adds what was kept."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# The disk (or the user's quota, or the file system's file size limit) is full: the user frees
# space, nothing is wrong with the file.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
NOT_WRITABLE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def disk_full_reason(e: OSError) -> str:
    if e.errno == errno.EFBIG:
        return "the file system does not take a file this large (File too large)"
    return f"the disk is full ({os.strerror(e.errno)})"


def write_failure_reason(e: OSError) -> str:
    """Why a write failed: "the disk is full (No space left on device)", "Permission denied", ..."""
    if e.errno in DISK_FULL_ERRNOS:
        return disk_full_reason(e)
    if e.errno == errno.ENAMETOOLONG:
        return f"a file name there is too long ({os.strerror(e.errno)})"
    return e.strerror or str(e)


def write_failure_remedy(folder: Path, e: OSError, elsewhere: str) -> str:
    """What the user does about it; ``elsewhere`` is the way to write somewhere else instead
    ("choose another --out", "set QWEN_TRAY_HOME to a writable folder")."""
    if e.errno in DISK_FULL_ERRNOS:
        return "free some space"
    if e.errno in NOT_WRITABLE_ERRNOS:
        return f"make {_nearest_existing(Path(folder))} writable or {elsewhere}"
    if e.errno == errno.ENAMETOOLONG:
        return "choose a shorter name"
    return f"check {folder}"


def _nearest_existing(folder: Path) -> Path:
    """The folder the write was refused in: ``folder``, or the nearest of its parents that exists."""
    folder = folder.absolute()
    return next((p for p in (folder, *folder.parents) if p.exists()), folder)
