"""Free disk space, checked before long work writes: a download, a conversion, a quantization.

Below hub/ and quant/, which both check before they write (hub/disk.py raises it as a download's
error; the quantizer as its own).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.progress import format_bytes

# Kept free beyond what a job writes: the journal, the tokenizer copies, other programs' needs.
MARGIN_BYTES = 200 * 1000 * 1000


def existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space_problem(needs: dict[Path, int], what: str) -> str | None:
    """Why the disks lack room for what ``needs`` (folder -> bytes to write there) puts on them, plus
    a margin, in one sentence; None when they have it. Folders on one filesystem add up."""
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
            return (f"not enough disk space for {what}: it needs {format_bytes(nbytes + MARGIN_BYTES)} "
                    f"on {anchor} ({format_bytes(nbytes)} plus a {format_bytes(MARGIN_BYTES)} margin) "
                    f"and {format_bytes(free)} is free; free some space and try again")
    return None
