"""The app's own model folders, ``models_dir()/NAME``: one process at a time per name, the
hidden staging folders of a killed run cleaned, and removal.

Work that writes ``models_dir()/NAME`` (a download's quantization, a GGUF conversion, a
removal) holds ``cache_dir()/locks/model-NAME.lock`` (filelock, as ``models get`` and the
settings store lock across processes). Its staging folders are hidden siblings named after the
folder: ``.NAME.<random>.partial`` (a conversion being written), ``.NAME.<random>.old`` (the
previous folder moved aside), ``.NAME.<random>.removing`` (a removal) and ``.NAME.fp16`` (a
GGUF dequantized for the quantizer, with its own ``..NAME.fp16.<random>.partial``). Whoever
holds the lock owns them; found when taking it, they are what a killed run left, and go.

A quantization also holds ``cache_dir()/locks/quantize-<hash of the folder's path>.lock``
(:func:`output_folder_lock`): ``quantize --out`` takes any folder, not a name.

A folder directly inside models_dir() is the app's: it made it (``models get``,
``import-gguf``, ``add-starter``), so ``models remove`` may delete it. A folder registered
from anywhere else (``models add``) is the user's and is never deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from app.errors import QwenTrayError
from app.paths import cache_dir, models_dir

log = logging.getLogger(__name__)
STAGING_SUFFIXES = ("partial", "old", "removing")


class FolderBusyError(QwenTrayError):
    """Another qwen-tray process is writing or removing the same model folder."""


@contextmanager
def model_folder_lock(name: str) -> Iterator[None]:
    """Hold the lock of ``models_dir()/name`` (or raise FolderBusyError at once) and remove the
    staging folders a killed run left there; release it at the end."""
    path = cache_dir() / "locks" / f"model-{name}.lock"
    lock = FileLock(path, timeout=0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        locked = True
    except Timeout:
        raise FolderBusyError(f"{models_dir() / name} is being written or removed by another qwen-tray process; "
                              "wait for it to finish, or stop it and run this again") from None
    except OSError as e:  # no lock where the cache cannot be written: the work may still go on, uncleaned
        log.warning("%s: not locked (%s); leftovers of earlier runs stay", path, e)
        locked = False
    try:
        if locked:
            remove_stale_staging(name)
        yield
    finally:
        if locked:
            lock.release()


@contextmanager
def output_folder_lock(folder: Path) -> Iterator[None]:
    """Hold the lock of a folder a quantization writes, by its path (``quantize --out``; the app's
    own folders too): a second run into it would take the first's journal for an interrupted
    run's and write the same files. Raise FolderBusyError at once, naming the holder's process."""
    key = hashlib.sha256(str(Path(folder).resolve()).encode()).hexdigest()[:16]  # one lock per folder
    path = cache_dir() / "locks" / f"quantize-{key}.lock"
    holder = path.with_suffix(".pid")  # beside the lock: filelock may truncate the lock file itself
    lock = FileLock(path, timeout=0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Timeout:
        pid = _read_pid(holder)
        raise FolderBusyError(f"another qwen-tray quantize is writing {folder}{f' (process {pid})' if pid else ''}; "
                              "wait for it to finish, or stop it and run this again") from None
    except OSError as e:  # no lock where the cache cannot be written: the work goes on unguarded
        log.warning("%s: not locked (%s)", path, e)
        yield
        return
    try:
        try:
            holder.write_text(str(os.getpid()), encoding="utf-8")
        except OSError:
            pass  # the lock holds all the same; a second run is refused without the process's number
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def staging_folders(name: str) -> list[Path]:
    """The hidden staging folders of ``models_dir()/name`` (see the module's docstring)."""
    folder = models_dir()
    if not folder.is_dir():
        return []
    fp16 = f".{name}.fp16"
    pattern = re.compile(rf"\.(?:{re.escape(name)}|{re.escape(fp16)})\.[^.]+\.(?:{'|'.join(STAGING_SUFFIXES)})")
    return sorted(p for p in folder.iterdir() if p.name == fp16 or pattern.fullmatch(p.name))


def remove_stale_staging(name: str) -> None:
    """Remove what a killed run left of ``models_dir()/name``; the caller holds its lock. A
    folder moved aside for a replacement that never came is put back first."""
    out = models_dir() / name
    stale = staging_folders(name)
    moved_aside = [p for p in stale if p.name.startswith(f".{name}.") and p.suffix == ".old"]
    if moved_aside and not out.exists():
        previous = max(moved_aside, key=lambda p: p.stat().st_mtime)
        os.replace(previous, out)
        stale.remove(previous)
        log.info("%s: put back from %s, where an interrupted replacement left it", out, previous.name)
    for path in stale:
        log.info("removing %s, left by an interrupted run", path)
        _remove(path)


def is_app_folder(path: Path) -> bool:
    """Whether ``path`` is a model folder the app made: directly inside models_dir(), no link."""
    path = Path(path).expanduser()
    try:
        return not path.is_symlink() and path.parent.resolve() == models_dir().resolve()
    except OSError:
        return False


def folder_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (links not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for file in files:
            try:
                total += os.lstat(os.path.join(root, file)).st_size
            except OSError:
                continue
    return total


def move_aside_for_removal(path: Path) -> Path:
    """Rename app folder ``path`` to a hidden ``.removing`` sibling at once (the caller holds
    its lock), so it is gone from its place before the slow delete; return the new path."""
    aside = path.with_name(f".{path.name}.{secrets.token_hex(4)}.removing")
    try:
        os.replace(path, aside)
    except OSError as e:
        raise QwenTrayError(f"cannot remove {path} ({e.strerror or e}); if the tray or `qwen-tray serve` has the model "
                            "loaded, switch it to another model or quit it, then try again; nothing was changed") from None
    return aside


def delete_moved_aside(aside: Path) -> bool:
    """Delete a folder moved aside for removal; False if some of it could not be deleted (the
    next run of work on its name removes the rest)."""
    _remove(aside)
    return not aside.exists()


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)
