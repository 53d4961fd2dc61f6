"""Download a snapshot into a folder: resumable across crashes and reboots, checked, cancellable.

Each file is fetched by huggingface_hub's ``http_get`` (its retries, ``Range`` resume within a
run, and the hub's HTTP errors) into ``<file>.part``, opened for appending: after a crash, a
kill or a cancel the next run asks for the rest with ``Range: bytes=<size of .part>-``. (From
version 1.18 huggingface_hub's own ``hf_hub_download`` writes each attempt to a fresh temporary
file and deletes it on failure, so it no longer resumes across runs: huggingface_hub#4196.)

When a connection breaks mid-file, ``http_get`` resumes it and logs a warning that a console
shows twice (its own handler and the root's); :class:`_ResumeNotices` takes that record and
the job's progress says it once, in our words. Every other warning is left alone.

A finished file is hashed and compared with the source's checksum (the hub's LFS sha256 or
git blob id, ModelScope's sha256) before it is renamed into place, and recorded as verified in
``.download.json``. A folder is a usable model source only once every file is verified
(:func:`is_complete`); a partial download is never quantized or registered.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from huggingface_hub.file_download import http_get

from app.hub.errors import ChecksumError, SourceFileError, explain
from app.hub.progress import DOWNLOADING, VERIFYING, JobCancelled, RateMeter, Reporter
from app.progress import format_bytes
from app.hub.sources import RemoteFile, Snapshot
from app.paths import atomic_write_text

log = logging.getLogger(__name__)
STATE_FILE = ".download.json"
PART_SUFFIX = ".part"
HASH_BLOCK = 8 << 20
HUB_DOWNLOAD_LOGGER = "huggingface_hub.file_download"  # where http_get logs that it resumes a file


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished, verified download."""
    state = _read_state(folder)
    return bool(state.get("complete")) and all(
        (folder / path).is_file() and entry.get("verified") for path, entry in state.get("files", {}).items())


def downloaded_bytes(folder: Path) -> int:
    """What a download into ``folder`` has on disk: its files and partial files (not its state)."""
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and p.name != STATE_FILE)


class SnapshotDownload:
    """Fetches ``snapshot`` into ``folder``, keeping what an earlier run of it left there."""

    def __init__(self, snapshot: Snapshot, folder: Path):
        self.snapshot, self.folder = snapshot, folder
        self._state = _read_state(folder)
        self._discard_stale()

    def remaining_bytes(self) -> int:
        """What is left to fetch (partial files count for what they already hold)."""
        return sum(f.size - self._have(f) for f in self.snapshot.files)

    def run(self, report: Reporter, cancel: threading.Event | None = None) -> None:
        done = sum(self._have(f) for f in self.snapshot.files)
        meter = RateMeter(DOWNLOADING, self.snapshot.total_bytes, "B", report, cancel, done=done,
                          files=len(self.snapshot.files), folder=str(self.folder))
        meter.set(done)  # the stage starts: the listing is read and the disk has room
        for remote in self.snapshot.files:
            if self._verified(remote):
                continue
            self._fetch(remote, meter)
            self._verify(remote, report, cancel)
        self._state["complete"] = True
        self._save_state()

    # -- one file --------------------------------------------------------------------------------
    def _fetch(self, remote: RemoteFile, meter: RateMeter) -> None:
        part = self._part(remote)
        part.parent.mkdir(parents=True, exist_ok=True)
        self._state.setdefault("files", {})[remote.path] = {"identity": remote.identity, "verified": False}
        self._save_state()  # before the first byte: the next run knows what this .part is
        have = part.stat().st_size if part.is_file() else 0
        meter.detail = remote.path
        meter.check_cancel()
        progress = functools.partial(_FileProgress, meter=meter, counted=have)
        try:
            with part.open("ab") as f, _resume_notices(remote, f.tell, meter):
                http_get(remote.url, _PartFile(f, meter), resume_size=have, headers=dict(self.snapshot.headers),
                         expected_size=remote.size, displayed_filename=remote.path, tqdm_class=progress)
        except JobCancelled:
            raise
        except Exception as e:
            error = explain(e, where=self.snapshot.endpoint, repo=self.snapshot.repo, what=remote.path)
            if error is not None:
                raise error from None
            if isinstance(e, OSError) and part.is_file() and part.stat().st_size != remote.size:
                part.unlink()  # the source's copy is not what its listing says: resuming it cannot help
                raise SourceFileError(
                    f"{self.snapshot.endpoint} sent {remote.path} of {self.snapshot.repo} with another size than "
                    f"its listing's {remote.size} bytes (a broken or outdated mirror?); try again later or use "
                    "another source") from None
            raise

    def _verify(self, remote: RemoteFile, report: Reporter, cancel: threading.Event | None) -> None:
        part = self._part(remote)
        meter = RateMeter(VERIFYING, remote.size, "B", report, cancel)
        meter.detail = remote.path
        sha256, git_sha1 = _hashes(part, remote.size, meter)
        expected, actual = ((remote.sha256, sha256) if remote.sha256 else (remote.git_sha1, git_sha1))
        if expected and actual != expected.lower():
            part.unlink()
            raise ChecksumError(f"{remote.path} of {self.snapshot.repo} from {self.snapshot.endpoint} does not match "
                                f"its checksum (got {actual[:12]}…, expected {expected[:12]}…); it was deleted, run "
                                "the same download again to fetch it anew")
        part.replace(self.folder / remote.path)
        self._state["files"][remote.path] = {"identity": remote.identity, "verified": True, "sha256": sha256}
        self._save_state()

    # -- state ------------------------------------------------------------------------------------
    def _part(self, remote: RemoteFile) -> Path:
        return self.folder / (remote.path + PART_SUFFIX)

    def _verified(self, remote: RemoteFile) -> bool:
        entry = self._state.get("files", {}).get(remote.path, {})
        same = entry.get("identity") == remote.identity or (remote.sha256 and entry.get("sha256") == remote.sha256)
        return bool(entry.get("verified") and same and (self.folder / remote.path).is_file()
                    and (self.folder / remote.path).stat().st_size == remote.size)

    def _have(self, remote: RemoteFile) -> int:
        if self._verified(remote):
            return remote.size
        part = self._part(remote)
        return min(part.stat().st_size, remote.size) if part.is_file() else 0

    def _discard_stale(self) -> None:
        """Drop files an earlier run left that are not what this snapshot wants (another revision)."""
        files = self._state.setdefault("files", {})
        wanted = {f.path: f for f in self.snapshot.files}
        for path, entry in list(files.items()):
            remote = wanted.get(path)
            if remote is not None and (self._verified(remote) or entry.get("identity") == remote.identity):
                continue
            for stale in (self.folder / path, self.folder / (path + PART_SUFFIX)):
                stale.unlink(missing_ok=True)
            del files[path]
        for remote in self.snapshot.files:
            part = self._part(remote)
            if part.is_file() and part.stat().st_size > remote.size:
                part.unlink()  # longer than the file can be: not a prefix of it
        self._state.update(source=self.snapshot.source, repo=self.snapshot.repo, revision=self.snapshot.revision,
                           complete=False)

    def _save_state(self) -> None:
        atomic_write_text(self.folder / STATE_FILE, json.dumps(self._state, indent=1) + "\n")


class _ResumeNotices(logging.Filter):
    """On huggingface_hub's download logger: its "Trying to resume download..." for ``remote``
    becomes one notice on the job's progress; every other record passes."""

    def __init__(self, remote: RemoteFile, written: Callable[[], int], meter: RateMeter):
        super().__init__()
        self.remote, self.written, self.meter = remote, written, meter

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if not (isinstance(record.msg, str) and record.msg.rstrip().endswith("Trying to resume download...")
                and args and args[0] == self.remote.url):
            return True
        reason = f" ({args[1]})" if len(args) > 1 and str(args[1]) else ""
        self.meter.tell(f"{self.remote.path}: the connection broke; resuming at {format_bytes(self.written())} of "
                        f"{format_bytes(self.remote.size)}{reason}")
        return False


@contextmanager
def _resume_notices(remote: RemoteFile, written: Callable[[], int], meter: RateMeter) -> Iterator[None]:
    logger = logging.getLogger(HUB_DOWNLOAD_LOGGER)
    notices = _ResumeNotices(remote, written, meter)
    logger.addFilter(notices)
    try:
        yield
    finally:
        logger.removeFilter(notices)


class _PartFile:
    """The ``.part`` file as http_get writes it: a cancel stops the download right after a chunk
    is written (http_get counts a chunk before writing it), so nothing received is lost."""

    def __init__(self, f, meter: RateMeter):
        self._f, self._meter = f, meter

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        self._meter.check_cancel()
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        return self._f.truncate(size)


class _FileProgress:
    """What ``http_get`` takes as its tqdm class: forwards the bytes to the job's meter.
    ``initial`` below what was counted means http_get restarted the file from 0 (the server
    ignored the Range): the meter gives those bytes back."""

    def __init__(self, *, meter: RateMeter, counted: int, initial: int = 0, **_tqdm_arguments):
        self.meter = meter
        if initial != counted:
            meter.add(initial - counted, check=False)

    def update(self, n: int = 1) -> None:
        self.meter.add(n, check=False)

    def close(self) -> None:
        pass

    def __enter__(self) -> _FileProgress:
        return self

    def __exit__(self, *exc) -> None:
        pass


def _hashes(path: Path, size: int, meter: RateMeter) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file in one read."""
    sha256, git_sha1 = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            sha256.update(block)
            git_sha1.update(block)
            meter.add(len(block))
    return sha256.hexdigest(), git_sha1.hexdigest()


def _read_state(folder: Path) -> dict:
    path = folder / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable (%s); the download starts over", path, e)
        return {}
    return state if isinstance(state, dict) else {}

