"""Removing a registered model: what ``qwen-tray models remove`` and the tray's Settings → Models share.

A folder the app made (:func:`app.model_folders.is_app_folder`: directly inside models_dir(),
no link) that no other name uses is deleted: under its name's lock it is renamed aside at
once, the name is unregistered (a failure puts the folder back, so nothing changed), then the
renamed folder is deleted. Anything else is only unregistered: a folder the user registered
from elsewhere (``models add``), a GGUF file, a remote endpoint, a folder another name still
uses, or any folder when the caller keeps the files. If the model was the default, the first
local model left becomes the default (:meth:`Settings.remove_model`).

The callers word the outcome themselves (the CLI in English, the tray in its language), so
:class:`RemovalPlan` and :class:`Removal` are data: what will happen / what happened, and why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from app.errors import QwenTrayError
from app.model_folders import (delete_moved_aside, folder_bytes, is_app_folder, model_folder_lock,
                               move_aside_for_removal)
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore

# Why a removal deletes nothing (RemovalPlan.kept).
KEPT_ASKED = "asked"  # --keep-files, or "Keep the files" in the tray
KEPT_REMOTE = "remote"  # a remote endpoint: nothing on disk
KEPT_GGUF = "gguf"  # the user's GGUF file
KEPT_MISSING = "missing"  # the folder is already gone
KEPT_SHARED = "shared"  # another registered name uses the folder (RemovalPlan.other)
KEPT_USERS = "users"  # a folder registered from elsewhere: the user's


@dataclass(frozen=True)
class RemovalPlan:
    """What removing ``entry`` does: delete ``folder`` (``nbytes`` of files), or only unregister (``kept``)."""

    entry: ModelEntry
    folder: Path | None  # the entry's folder or file on disk (None: a remote endpoint)
    delete: bool  # the folder is the app's and goes
    nbytes: int = 0  # the folder's size when it goes
    kept: str = ""  # why nothing is deleted (KEPT_*), when not ``delete``
    other: str = ""  # KEPT_SHARED: the other name registered to the folder


@dataclass(frozen=True)
class Removal:
    """What :func:`remove_model` did."""

    plan: RemovalPlan
    freed: int  # bytes deleted (0 when only unregistered)
    left_in: Path | None  # the moved-aside folder where files that could not be deleted remain
    was_default: bool
    default: str | None  # the default model now


def plan_removal(entry: ModelEntry, models: list[ModelEntry], *, keep_files: bool = False) -> RemovalPlan:
    """What removing ``entry`` from the registry ``models`` would do (looks at the disk, changes nothing).
    ``keep_files`` keeps a folder that would be deleted; the tray passes it also when its question
    said the files stay, so a folder is never deleted that the user was told would stay."""
    if entry.kind == "remote":
        return RemovalPlan(entry, None, False, kept=KEPT_REMOTE)
    folder = Path(entry.path).expanduser()
    if entry.kind == "gguf":
        return RemovalPlan(entry, folder, False, kept=KEPT_GGUF)
    if not folder.exists():
        return RemovalPlan(entry, folder, False, kept=KEPT_MISSING)
    other = other_user(entry, models)
    if other is not None:
        return RemovalPlan(entry, folder, False, kept=KEPT_SHARED, other=other)
    if entry.kind != "local" or not folder.is_dir() or not is_app_folder(folder):
        return RemovalPlan(entry, folder, False, kept=KEPT_USERS)
    if keep_files:  # said last: a folder that would stay anyway stays for its own reason
        return RemovalPlan(entry, folder, False, kept=KEPT_ASKED)
    return RemovalPlan(entry, folder, True, nbytes=folder_bytes(folder))


def remove_model(name: str, *, keep_files: bool = False, store: SettingsStore | None = None) -> Removal:
    """Unregister ``name``; delete its folder when the app made it and no other entry uses it.

    Raises QwenTrayError (one sentence) when no model has that name, when another process holds
    the folder's lock, or when the folder cannot be moved (Windows: a program has its files
    open); nothing was changed then."""
    store = store or SettingsStore()
    settings = store.load()
    entry = settings.model(name)
    if entry is None:
        raise store.unread_model(name) or QwenTrayError(f"no model named {name!r}; `qwen-tray models list` shows "
                                                        "the registered ones")
    plan = plan_removal(entry, settings.models, keep_files=keep_files)
    if not plan.delete:
        return Removal(plan, 0, None, *_unregister(store, name))
    with model_folder_lock(plan.folder.name):
        freed = folder_bytes(plan.folder)
        aside = move_aside_for_removal(plan.folder)  # out of its place first: a failed unregistering puts it back
        try:
            was_default, default = _unregister(store, name)
        except BaseException:
            os.replace(aside, plan.folder)
            raise
        deleted = delete_moved_aside(aside)
    return Removal(plan, freed, None if deleted else aside, was_default, default)


def _unregister(store: SettingsStore, name: str) -> tuple[bool, str | None]:
    """Remove ``name`` from the registry: (whether it was the default, the default now)."""
    with store.edit() as settings:
        was_default = settings.default_model == name
        settings.remove_model(name)
        return was_default, settings.default_model


@dataclass(frozen=True)
class FolderDeletion:
    freed: int
    left_in: Path | None  # where what could not be deleted remains


def delete_app_folder(folder: Path) -> FolderDeletion:
    """Delete an app-made folder no entry uses any more (``models add --replace``), under its lock."""
    with model_folder_lock(folder.name):
        freed = folder_bytes(folder)
        aside = move_aside_for_removal(folder)
        deleted = delete_moved_aside(aside)
    return FolderDeletion(freed, None if deleted else aside)


def app_folder_to_delete(entry: ModelEntry, models: list[ModelEntry]) -> Path | None:
    """``entry``'s folder if the app made it, it exists and no other entry uses it; else None."""
    plan = plan_removal(entry, models)
    return plan.folder if plan.delete else None


def other_user(entry: ModelEntry, models: list[ModelEntry]) -> str | None:
    """The name of another local entry registered to ``entry``'s folder, if any."""
    folder = Path(entry.path).expanduser().resolve()
    return next((m.name for m in models if m.name != entry.name and m.kind == "local"
                 and Path(m.path).expanduser().resolve() == folder), None)
