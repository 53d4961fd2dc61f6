"""Removing a model from Settings → Models on a worker thread (app/model_removal.py, as the CLI does it).

The removal takes effect when the user confirms it (deleted files cannot come back), not when
the settings dialog saves. A model the tray has loaded is unloaded first (EngineHost.unload):
Windows cannot delete files a program holds open, and a model whose files are gone could not
be loaded again anyway; the app then switches to the default model (app.py). If the removal
fails, the unloaded model is loaded again, so a failure changes nothing. The outcome reaches
the UI thread as Qt signals, like the model jobs' (model_jobs.py).
"""

from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QObject, Signal

from app.errors import QwenTrayError
from app.progress import format_bytes
from app.model_removal import (KEPT_ASKED, KEPT_GGUF, KEPT_MISSING, KEPT_REMOTE, KEPT_SHARED, KEPT_USERS, Removal,
                               RemovalPlan, plan_removal, remove_model)
from app.settings.store import SettingsStore
from app.ui.controllers.engine_host import EngineHost
from app.ui.i18n import tr
from app.ui.models import ModelEntry

log = logging.getLogger(__name__)


class ModelRemoval(QObject):
    finished = Signal(object, bool)  # Removal, whether the tray had the model loaded (unloaded first)
    failed = Signal(str)
    runningChanged = Signal(bool)
    # Internal: from the worker thread to the UI thread.
    _removed = Signal(object)
    _refused = Signal(str)

    def __init__(self, host: EngineHost | None, store: SettingsStore | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self._host = host  # None: no tray behind the dialog (nothing loaded to let go of)
        self._store = store or SettingsStore()
        self.name = ""  # the model being removed, for the UI
        self._thread: threading.Thread | None = None
        self._wish: tuple[str, bool] | None = None  # (name, keep files) while the model is being unloaded
        self._unloaded: ModelEntry | None = None  # what was loaded before this removal, to reload on failure
        self._removed.connect(self._on_removed)
        self._refused.connect(self._on_refused)
        if host is not None:
            host.unloaded.connect(self._on_unloaded)
            # a model chosen in the tray menu while this one unloads: loaded instead of the unloading
            host.loaded.connect(self._on_host_settled)
            host.loadFailed.connect(self._on_host_settled)

    @property
    def running(self) -> bool:
        return bool(self.name)

    def plan(self, name: str) -> RemovalPlan | None:
        """What removing ``name`` would do, from the registry on disk now (None: it is not registered)."""
        settings = self._store.load()
        entry = settings.model(name)
        return plan_removal(entry, settings.models) if entry is not None else None

    def in_use(self, name: str) -> bool:
        """Whether the tray has ``name`` loaded (or is loading it)."""
        return self._host is not None and self._host.entry is not None and self._host.entry.name == name

    def start(self, name: str, keep_files: bool) -> bool:
        """Remove ``name`` (after unloading it if the tray uses it), unless a removal runs (False then)."""
        if self.running:
            return False
        self.name, self._unloaded = name, None
        self.runningChanged.emit(True)
        if self.in_use(name):
            self._unloaded, self._wish = self._host.entry, (name, keep_files)
            self._host.unload()
        else:
            self._work(name, keep_files)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _on_unloaded(self) -> None:
        wish, self._wish = self._wish, None
        if wish is not None:
            self._work(*wish)

    def _on_host_settled(self, *_signal_args) -> None:
        if self._wish is None:
            return
        if self.in_use(self._wish[0]):
            self._host.unload()  # the menu chose this very model again: let go of it once more
        else:
            self._on_unloaded()

    def _work(self, name: str, keep_files: bool) -> None:
        self._thread = threading.Thread(target=self._run, args=(name, keep_files), name="qwen-tray-model-removal",
                                        daemon=True)
        self._thread.start()

    def _run(self, name: str, keep_files: bool) -> None:
        try:
            removal = remove_model(name, keep_files=keep_files, store=self._store)
        except QwenTrayError as e:
            self._refused.emit(str(e))
        except Exception as e:  # noqa: BLE001 - a bug; keep the tray alive and log the traceback
            log.exception("removing %s failed", name)
            self._refused.emit(tr("Internal error: {error}", error=f"{type(e).__name__}: {e}"))
        else:
            self._removed.emit(removal)

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.name = ""
        self.runningChanged.emit(False)

    def _on_removed(self, removal: Removal) -> None:
        in_use = self._unloaded is not None
        self._join()
        self.finished.emit(removal, in_use)

    def _on_refused(self, message: str) -> None:
        unloaded, self._unloaded = self._unloaded, None
        self._join()
        if unloaded is not None and self._host is not None and self._host.entry is None:
            self._host.switch_to(unloaded)  # nothing was removed: the tray goes on with its model
        self.failed.emit(message)


def removal_summary(removal: Removal) -> str:
    """One line: what was deleted (and how much it freed) or kept, and the default model now."""
    plan = removal.plan
    if plan.delete:
        text = tr("Removed {name}: deleted {folder}, {size} freed", name=plan.entry.name, folder=str(plan.folder),
                  size=format_bytes(removal.freed))
        if removal.left_in is not None:
            text += tr(" (some files could not be deleted: {folder} holds them)", folder=str(removal.left_in))
    else:
        text = tr("Removed {name}: {why}; nothing was deleted", name=plan.entry.name, why=kept_reason(plan))
    if removal.was_default:
        text += (tr("; the default model is now {model}", model=removal.default) if removal.default
                 else tr("; there is no default model now"))
    return text


def kept_reason(plan: RemovalPlan) -> str:
    """Why removing ``plan``'s entry deletes nothing, as part of a sentence."""
    entry, folder = plan.entry, str(plan.folder)
    return {
        KEPT_REMOTE: lambda: tr("a remote endpoint ({url}), nothing on disk", url=entry.base_url),
        KEPT_GGUF: lambda: tr("its GGUF file {file} is yours and stays", file=entry.path),
        KEPT_ASKED: lambda: tr("its folder {folder} stays, as you asked", folder=folder),
        KEPT_MISSING: lambda: tr("its folder {folder} was already gone", folder=folder),
        KEPT_SHARED: lambda: tr("its folder {folder} stays, model {model} uses it too", folder=folder,
                                model=plan.other),
        KEPT_USERS: lambda: tr("its folder {folder} was added from elsewhere and is yours, so it stays",
                               folder=folder),
    }[plan.kept]()
