"""The one settings store: ``<config>/settings.json`` holds the model registry, the default
model, the tray's preferences and the user's actions, for the CLI and the tray alike.

Reading never raises for a file problem: what went wrong becomes a :class:`Notice` (saying
where a broken file went), given to ``on_notice`` or kept for :meth:`SettingsStore.take_notices`,
and the settings are what could be used (or the defaults). Writing is atomic and raises
SettingsFileError, one sentence naming the file and what to do, when the folder is not
writable or when a file on disk could not be read (saving would lose what it holds).

A change is load, change, save (:meth:`SettingsStore.edit`), so the tray and a CLI command
never undo each other's changes: a lock serializes the edits of one process (the tray's
worker and UI threads), and a lock file (the ``filelock`` package; in the cache folder, so
the config folder keeps the one file people read) those of processes (commands run at the
same time, the tray beside them).

API keys of remote endpoints do not stay in the file: saving moves them into the OS keyring
(app/secrets.py), and a file that still holds some (an earlier version's) is saved again at
once; removing an endpoint deletes its key. Where no keyring exists they stay in the file and
the user is told so.

Version-1 files (app/settings/migrate.py) are read on the first load and written as one
version-2 file; the old files are then kept beside it as ``NAME.v1-backup-<time>.json``:
not deleted, since a value the migration could not use is still in them; not left under
their names, where someone would edit a file nothing reads any more. A file with values
that were left out is copied (``settings.invalid-<time>.json``) before it is first
rewritten without them.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from filelock import FileLock, Timeout

from app import secrets
from app.paths import cache_dir, config_dir
from app.settings.document import Settings, settings_from_json
from app.settings.jsonfile import (CORRUPT, OK, UNREADABLE, JsonRead, SettingsFileError, cannot_write, keep_aside,
                                   os_reason, read_json, write_json)
from app.settings.migrate import ACTIONS_V1, PREFERENCES_V1, is_version_1, settings_from_v1
from app.settings.models import ModelEntry
from app.settings.notices import Notice
from app.settings.shown import first_showing

log = logging.getLogger(__name__)
FILE_NAME = "settings.json"
_EDITS = threading.RLock()  # one load-change-save at a time in this process
LOCK_WAIT_S = 30  # another process's edit is a load and a save: far less, unless it hangs
BUSY = "{file} is being changed by another qwen-tray process that does not finish; try again"

MOVED_ASIDE = "{file} could not be used ({error}); it was moved to {backup} and the defaults are used"
NOT_MOVED = ("{file} could not be used ({error}) and could not be moved aside ({reason}); the defaults are used "
             "for now and the file is left as it is")
UNREADABLE_FILE = ("{file} cannot be read ({error}); the defaults are used for now and the file is left as it is: "
                   "check its permissions")
LEFT_OUT = "{file}: {problem}"
KEPT_BEFORE_SAVE = "{file} had values that could not be used; the file as it was is kept as {backup}"
MIGRATED = "The settings of an earlier version were moved into {file}; the old files are kept as {backups}"
KEYS_MOVED = "The API keys of {models} were moved from {file} into the system keyring ({keyring})"
# keyrings.alt's files: not a system keyring, and a plain-text one must not be called safe
KEYS_MOVED_TO_PLAIN_FILE = ("The API keys of {models} were moved from {file} into {store}, a plain-text file "
                            "(keyrings.alt; not a system keyring)")
KEYS_MOVED_TO_ENCRYPTED_FILE = ("The API keys of {models} were moved from {file} into {store}, an encrypted file "
                                "(keyrings.alt; not a system keyring)")
KEYS_IN_FILE = "The API keys of {models} stay in {file} as plain text: {reason}"
SHOWN_ONCE = frozenset({KEYS_IN_FILE})  # a lasting state, not news: told once ever (app.settings.shown)


def settings_path() -> Path:
    return config_dir() / FILE_NAME


class SettingsStore:
    def __init__(self, path: Path | None = None, on_notice: Callable[[Notice], None] | None = None,
                 every_notice: bool = False):
        """``every_notice``: tell the notices that are otherwise told once ever (SHOWN_ONCE) too
        (``qwen-tray doctor``: a report of everything that is so)."""
        self.path = path or settings_path()
        self._on_notice = on_notice
        self._every_notice = every_notice
        self._pending: list[Notice] = []
        self._told: set[str] = set()  # each notice once per store, however often the file is read again
        self._blocked: tuple[str, str] | None = None  # why saving would lose a file's contents, what to do
        self._invalid = False  # the file on disk has values the last load left out
        self._v1_files: list[Path] = []  # version-1 files the last load read: kept aside by the next save
        self._remote_names: set[str] = set()  # the remote endpoints on disk: a removed one's key is deleted

    # -- reading ---------------------------------------------------------------------------------
    def load(self) -> Settings:
        """The settings on disk, as far as they can be used; never raises for a file problem."""
        with _EDITS:
            self._blocked, self._invalid, self._v1_files = None, False, []
            read = self._read(self.path, dict)
            if read.state == UNREADABLE:
                return Settings()
            if read.state == OK and not is_version_1(read.data):
                settings, problems = settings_from_json(read.data)
                self._left_out(self.path, problems)
                self._invalid = bool(problems)
                self._remote_names = _remote_names(settings.models)
                self._keys_out_of_file(settings)
                return settings
            return self._migrate(read.data if read.state == OK else None)

    def cannot_register(self) -> str | None:
        """Why nothing can be registered after the last :meth:`load` (the file could not be read,
        nor moved aside, so saving would lose it) and what to do, in one sentence; else None."""
        if self._blocked is None:
            return None
        why, remedy = self._blocked
        return f"{why}, so no model can be registered until it is fixed: {remedy.removesuffix(', then try again')}"

    def unread_registry(self) -> str | None:
        """Why the models of the last :meth:`load` may not be the file's (it could not be read, or
        not used nor moved aside) and what to do, as the end of a sentence; else None."""
        if self._blocked is None:
            return None
        why, remedy = self._blocked
        return f"{why}; {remedy}"

    def unread_model(self, name: str) -> SettingsFileError | None:
        """For a model ``name`` the last :meth:`load` did not find, the error saying the file it may
        be registered in could not be read (not "no model named ..."); None when the file was read."""
        unread = self.unread_registry()
        return None if unread is None else SettingsFileError(f"model {name!r} cannot be looked up: {unread}")

    def take_notices(self) -> list[Notice]:
        """The notices not given to ``on_notice`` yet (each once)."""
        pending, self._pending = self._pending, []
        return pending

    def _read(self, path: Path, shape: type) -> JsonRead:
        """Read ``path``; an unreadable file blocks saving, a corrupt one is moved aside (both told)."""
        read = read_json(path)
        if read.state == OK and not isinstance(read.data, shape):
            read = JsonRead(CORRUPT, problem=f"expected a JSON {'object' if shape is dict else 'list'}")
        if read.state == UNREADABLE:
            self._blocked = self._blocked or (f"{path} could not be read ({read.problem})",
                                              f"fix its permissions or move it away (e.g. to {path.name}.bak), "
                                              "then try again")
            self._tell(Notice(UNREADABLE_FILE, {"file": str(path), "error": read.problem}))
        elif read.state == CORRUPT:
            self._move_aside(path, read.problem)
        return read

    def _move_aside(self, path: Path, problem: str) -> None:
        try:
            backup = keep_aside(path)
        except FileNotFoundError:
            return  # another process moved it first and told its user
        except OSError as e:
            self._blocked = self._blocked or (f"{path} could not be used ({problem}) nor moved aside ({os_reason(e)})",
                                              f"make {path.parent} writable or move the file away, then try again")
            self._tell(Notice(NOT_MOVED, {"file": str(path), "error": problem, "reason": os_reason(e)}))
            return
        self._tell(Notice(MOVED_ASIDE, {"file": str(path), "error": problem, "backup": str(backup)}))

    def _migrate(self, core: dict | None) -> Settings:
        """Settings from version-1 files (``core``: the old settings.json, if there was one), written
        as one version-2 file when the folder allows it (else read this way again next time)."""
        folder = self.path.parent
        preferences = self._read(folder / PREFERENCES_V1, dict)
        actions = self._read(folder / ACTIONS_V1, list)
        found = {self.path: core, folder / PREFERENCES_V1: preferences.data if preferences.state == OK else None,
                 folder / ACTIONS_V1: actions.data if actions.state == OK else None}
        if all(data is None for data in found.values()):
            return Settings()
        settings, problems = settings_from_v1(*found.values())
        for name, lost in problems.items():
            self._left_out(folder / name, lost)
        self._v1_files = [path for path, data in found.items() if data is not None]
        if self._blocked is None:
            try:
                self.save(settings)
            except SettingsFileError as e:
                log.info("version-1 settings read again next time: %s", e)
        return settings

    def _keys_out_of_file(self, settings: Settings) -> None:
        """A file that still holds API keys (an earlier version's) is saved again: into the keyring."""
        keyed = [m.name for m in settings.models if _keyed(m)]
        if not keyed:
            return
        if self._blocked is not None or secrets.unavailable_reason() is not None:
            self._store_keys(settings.models)  # (says why they stay)
            return
        try:
            self.save(settings)
        except SettingsFileError as e:
            log.info("API keys moved into the keyring next time: %s", e)
            return
        moved = [name for name in keyed if not any(m.name == name and _keyed(m) for m in settings.models)]
        if moved:
            self._tell(_keys_moved(", ".join(moved), self.path))

    def _store_keys(self, models: list[ModelEntry]) -> list[ModelEntry]:
        """``models`` with their API keys in the keyring (the file keeps them where none exists); the
        keys of endpoints removed since the last load are deleted."""
        for name in self._remote_names - _remote_names(models):
            try:
                secrets.delete_api_key(name)
            except secrets.SecretsError as e:
                log.warning("%s", e)
        keyed = [m for m in models if _keyed(m)]
        if not keyed:
            return models
        reason = secrets.unavailable_reason()
        if reason is not None:
            self._tell(Notice(KEYS_IN_FILE, {"models": ", ".join(m.name for m in keyed), "file": str(self.path),
                                             "reason": reason}))
            return models
        stored = []
        for entry in models:
            if _keyed(entry):
                try:
                    secrets.set_api_key(entry.name, entry.api_key)
                    entry = replace(entry, api_key="")
                except secrets.SecretsError as e:
                    self._tell(Notice(KEYS_IN_FILE, {"models": entry.name, "file": str(self.path), "reason": str(e)}))
            stored.append(entry)
        return stored

    def _left_out(self, path: Path, problems: list[str]) -> None:
        for problem in problems:
            self._tell(Notice(LEFT_OUT, {"file": str(path), "problem": problem}))

    def _tell(self, notice: Notice) -> None:
        if str(notice) in self._told:
            return
        self._told.add(str(notice))
        log.info("settings notice: %s", notice)
        if notice.template in SHOWN_ONCE and not self._every_notice and not first_showing(str(notice)):
            return  # told at an earlier command (README: "says so once"); doctor says it again
        if self._on_notice is not None:
            self._on_notice(notice)
        else:
            self._pending.append(notice)

    # -- writing ---------------------------------------------------------------------------------
    def save(self, settings: Settings) -> None:
        """Write ``settings`` atomically (after the last :meth:`load` of this store)."""
        with _EDITS:
            if self._blocked is not None:
                why, remedy = self._blocked
                raise SettingsFileError(f"cannot save {self.path}: {why}, and saving would lose what it holds; "
                                        f"{remedy}")
            kept = []
            if self._invalid or self.path in self._v1_files:  # the file being replaced is kept as it was
                kept.append(self._keep(self.path, "v1-backup" if self._v1_files else "invalid", copy=True))
            settings.models = self._store_keys(settings.models)
            write_json(self.path, settings.to_json())
            self._remote_names = _remote_names(settings.models)
            kept += [backup for path in self._v1_files if path != self.path
                     if (backup := self._keep_written(path)) is not None]
            if self._v1_files:
                self._tell(Notice(MIGRATED, {"file": str(self.path), "backups": ", ".join(str(p) for p in kept)}))
            elif self._invalid:
                self._tell(Notice(KEPT_BEFORE_SAVE, {"file": str(self.path), "backup": str(kept[0])}))
            self._invalid, self._v1_files = False, []

    def _keep(self, path: Path, label: str, *, copy: bool = False) -> Path:
        try:
            return keep_aside(path, label, copy=copy)
        except OSError as e:
            raise cannot_write(path, e) from None

    def _keep_written(self, path: Path) -> Path | None:
        """Move a version-1 file aside once its settings are in the new file (a failure costs nothing)."""
        try:
            return keep_aside(path, "v1-backup")
        except FileNotFoundError:
            return None  # another process migrated it at the same time
        except OSError as e:
            log.warning("%s: not moved aside after migration (%s); it is no longer read", path, os_reason(e))
            return None

    @contextmanager
    def edit(self) -> Iterator[Settings]:
        """Load, let the caller change, save if anything changed:
        ``with store.edit() as settings: settings.add_model(...)``."""
        with _EDITS, self._other_processes_wait():
            settings = self.load()
            before = settings.to_json()
            yield settings
            if settings.to_json() != before:
                self.save(settings)

    @contextmanager
    def _other_processes_wait(self) -> Iterator[None]:
        """Hold the lock file beside the settings. Where it cannot be made (a read-only folder)
        the edit goes on unlocked: its save then says why it cannot write."""
        key = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:16]  # one lock per settings file
        path = cache_dir() / "locks" / f"settings-{key}.lock"
        lock = FileLock(path, timeout=LOCK_WAIT_S)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except Timeout:
            raise SettingsFileError(BUSY.format(file=self.path)) from None
        except OSError:
            yield
            return
        try:
            yield
        finally:
            lock.release()


def _keyed(entry: ModelEntry) -> bool:
    return entry.kind == "remote" and bool(entry.api_key)


def _remote_names(models: list[ModelEntry]) -> set[str]:
    return {m.name for m in models if m.kind == "remote"}


def _keys_moved(models: str, path: Path) -> Notice:
    """Where the keys went, in words the user knows: the system keyring by its name, or keyrings.alt's file."""
    kind, where = secrets.key_store()
    if kind == "plain-text file":
        return Notice(KEYS_MOVED_TO_PLAIN_FILE, {"models": models, "file": str(path), "store": where})
    if kind == "encrypted file":
        return Notice(KEYS_MOVED_TO_ENCRYPTED_FILE, {"models": models, "file": str(path), "store": where})
    return Notice(KEYS_MOVED, {"models": models, "file": str(path), "keyring": where})
