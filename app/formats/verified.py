"""Checkpoint files already verified, so loading a model hashes each file once per change.

Loading a checkpoint checks every file's sha256 (a 7B ``mixed`` checkpoint is ~3 GB: seconds
on a laptop, every model switch). After a file passes, its resolved path, its *stamp* and its
sha256 are remembered in ``verified_files.json`` in the cache folder; a later load skips the
hash while the stamp still matches. The stamp is what changes when the bytes do, short of a
full read:

- the file's size, modification time, status-change time (ctime) and inode (ns): a rewrite,
  a copy or a rename over the file changes them, and so does restoring the modification time
  afterwards (``os.utime`` sets the ctime to now; nothing but the clock sets it back) — on
  Windows the "ctime" is the creation time, which an in-place write keeps;
- the sha256 of SAMPLE_BLOCKS blocks of SAMPLE_BYTES at fixed offsets (the start, the end and
  evenly between): a change there is caught even where the stat misses it.

``--verify`` (``ask``, ``serve``, ``checkpoint info``) hashes every file whatever the cache
says. The file is a cache: unreadable or unwritable, it is ignored; entries of an older
layout simply do not match (those files are hashed once more).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from app.paths import atomic_write_text, cache_dir

log = logging.getLogger(__name__)
CACHE_FILE = "verified_files.json"
MAX_ENTRIES = 256  # a few checkpoints' worth; the oldest entries go first
SAMPLE_BYTES = 64 << 10
SAMPLE_BLOCKS = 4

Stamp = dict  # {"size", "mtime_ns", "ctime_ns", "inode", "sample"}: JSON as it is


def sample_offsets(size: int) -> list[int]:
    """Where the sampled blocks start: 0, the last block, and evenly between."""
    last = max(0, size - SAMPLE_BYTES)
    return sorted({last * i // (SAMPLE_BLOCKS - 1) for i in range(SAMPLE_BLOCKS)})


def sampled_sha256(file: Path, size: int) -> str:
    """sha256 of the size and the sampled blocks of ``file`` (the whole file when it is small)."""
    digest = hashlib.sha256(str(size).encode())
    with open(file, "rb") as f:
        for offset in sample_offsets(size):
            f.seek(offset)
            digest.update(f.read(SAMPLE_BYTES))
    return digest.hexdigest()


class VerifiedFiles:
    """The cache of verified files (one JSON object: path -> {stamp..., "sha256"})."""

    def __init__(self, folder: Path | None = None):
        self.path = (folder or cache_dir()) / CACHE_FILE
        self._lock = threading.Lock()  # files are checked on a thread pool
        self._entries = self._read()
        self._dirty = False

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.info("ignoring the verified-files cache %s (%s)", self.path, e)
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def stamp(file: Path) -> Stamp | None:
        """What a later check compares, or None when the file cannot be read (then it is hashed)."""
        try:
            st = os.stat(file)
            return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                    "inode": st.st_ino, "sample": sampled_sha256(file, st.st_size)}
        except OSError:
            return None

    @staticmethod
    def _key(file: Path) -> str:
        return str(file.resolve())

    def is_verified(self, file: Path, sha256: str, stamp: Stamp | None = None) -> bool:
        """Whether ``file`` passed with ``sha256`` before and its stamp (taken now unless
        given) is still the same."""
        stamp = stamp or self.stamp(file)
        with self._lock:
            return stamp is not None and self._entries.get(self._key(file)) == {**stamp, "sha256": sha256}

    def remember(self, file: Path, sha256: str, stamp: Stamp | None = None) -> None:
        """Note ``file`` as verified with ``stamp`` (taken before it was hashed, best; now
        unless given), in memory; :meth:`save` writes the cache once."""
        stamp = stamp or self.stamp(file)
        if stamp is None:
            return
        key = self._key(file)
        with self._lock:
            self._entries.pop(key, None)  # re-inserted last: newest
            self._entries[key] = {**stamp, "sha256": sha256}
            while len(self._entries) > MAX_ENTRIES:
                self._entries.pop(next(iter(self._entries)))
            self._dirty = True

    def save(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            text = json.dumps(self._entries, indent=0)
            self._dirty = False
        try:
            atomic_write_text(self.path, text)
        except OSError as e:
            log.info("could not update the verified-files cache %s (%s)", self.path, e)
