"""Free disk space, checked before a download starts: the download and the checkpoint must fit."""

from __future__ import annotations

from pathlib import Path

from app.disk_space import free_space_problem
from app.hub.errors import DiskSpaceError


def check_free_space(needs: dict[Path, int], what: str) -> None:
    """Raise DiskSpaceError unless each filesystem has room for what ``needs`` (folder -> bytes
    to write there) puts on it, plus a margin (app.disk_space)."""
    problem = free_space_problem(needs, what)
    if problem is not None:
        raise DiskSpaceError(problem)


def check_space_to_convert(gguf: Path, out: Path) -> None:
    """Raise DiskSpaceError unless ``out``'s file system has room for the float16 folder that
    converting ``gguf`` writes (the starter model, ``models import-gguf``), plus the margin."""
    from app.engine.gguf_import import fp16_size  # numpy and gguf: only when converting

    check_free_space({out: fp16_size(gguf)}, f"converting {gguf.name}")
