"""Checkpoint files already verified, so loading a model hashes each file once per change.

Loading a checkpoint checks every file's sha256 (a 7B ``mixed`` checkpoint is ~3 GB: seconds
on a laptop, every model switch). After a file passes, its resolved path, size, modification
time (ns) and sha256 are remembered in ``verified_files.json`` in the cache folder; a later
load skips the hash while all four still match. Any change to the file (a rewrite, a copy
over it) changes the size or mtime and brings the full check back; ``qwen-tray checkpoint
info --verify`` always hashes. The file is a cache: unreadable or unwritable, it is ignored.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from app.paths import atomic_write_text, cache_dir

log = logging.getLogger(__name__)
CACHE_FILE = "verified_files.json"
MAX_ENTRIES = 256  # a few checkpoints' worth; the oldest entries go first


class VerifiedFiles:
    """The cache of verified files (one JSON object: path -> [size, mtime_ns, sha256])."""

    def __init__(self, folder: Path | None = None):
        self.path = (folder or cache_dir()) / CACHE_FILE
        self._lock = threading.Lock()  # files are checked on a thread pool
        self._entries = self._read()
        self._dirty = False

    def _read(self) -> dict[str, list]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.info("ignoring the verified-files cache %s (%s)", self.path, e)
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _stamp(file: Path, sha256: str) -> tuple[str, list] | None:
        try:
            st = file.stat()
            return str(file.resolve()), [st.st_size, st.st_mtime_ns, sha256]
        except OSError:
            return None

    def is_verified(self, file: Path, sha256: str) -> bool:
        stamp = self._stamp(file, sha256)
        with self._lock:
            return stamp is not None and self._entries.get(stamp[0]) == stamp[1]

    def remember(self, file: Path, sha256: str) -> None:
        """Note ``file`` as verified (in memory; :meth:`save` writes the cache once)."""
        stamp = self._stamp(file, sha256)
        if stamp is None:
            return
        with self._lock:
            self._entries.pop(stamp[0], None)  # re-inserted last: newest
            self._entries[stamp[0]] = stamp[1]
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
