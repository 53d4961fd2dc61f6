"""Free disk space, checked before a download starts: the download and the checkpoint must fit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.hub.errors import DiskSpaceError
from app.hub.progress import format_bytes

# Kept free beyond what a job writes: the journal, the tokenizer copies, other programs' needs.
MARGIN_BYTES = 200 * 1000 * 1000


def existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_free_space(needs: dict[Path, int], what: str) -> None:
    """Raise DiskSpaceError unless each filesystem has room for what ``needs`` (folder -> bytes
    to write there) puts on it, plus a margin; folders on one filesystem add up."""
    by_device: dict[int, tuple[Path, int]] = {}
    for folder, nbytes in needs.items():
        anchor = existing_parent(folder)
        device = os.stat(anchor).st_dev
        first, total = by_device.get(device, (anchor, 0))
        by_device[device] = (first, total + max(nbytes, 0))
    for anchor, nbytes in by_device.values():
        if nbytes <= 0:
            continue
        free = shutil.disk_usage(anchor).free
        if nbytes + MARGIN_BYTES > free:
            raise DiskSpaceError(f"not enough disk space for {what}: it needs {format_bytes(nbytes + MARGIN_BYTES)} "
                                 f"on {anchor} ({format_bytes(nbytes)} plus a {format_bytes(MARGIN_BYTES)} margin) "
                                 f"and {format_bytes(free)} is free; free some space and try again")


def check_space_to_convert(gguf: Path, out: Path) -> None:
    """Raise DiskSpaceError unless ``out``'s file system has room for the float16 folder that
    converting ``gguf`` writes (the starter model, ``models import-gguf``), plus the margin."""
    from app.engine.gguf_import import fp16_size  # numpy and gguf: only when converting

    check_free_space({out: fp16_size(gguf)}, f"converting {gguf.name}")
