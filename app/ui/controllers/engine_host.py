"""The one model behind hotkeys, chat and the local API, loaded and switched off the UI thread.

States: ``empty`` (nothing loaded), ``loading`` (with progress), ``ready``, ``error``,
``unloaded`` (the model gave its memory back after ``idle_unload_seconds`` without requests;
the backend stays, and the next request loads it again: ``loading``, then ``ready``);
``busy`` is ready with at least one request running. A switch cancels running requests,
closes the old backend (``engine.close()`` frees its memory) and only then opens the new
one, all on a loader thread. A switch asked for while loading is queued; the last wins.
:meth:`EngineHost.unload` closes the model the same way and opens none (``empty``): a removal
deletes its files next, which Windows refuses while the model holds them open.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.errors import QwenTrayError
from app.ui.backend.base import ChatBackend
from app.ui.controllers.tasks import StreamTask
from app.ui.i18n import tr
from app.ui.models import ModelEntry, open_backend

log = logging.getLogger(__name__)
Opener = Callable[..., ChatBackend]  # (entry, progress=callable, device="auto"|"cpu") -> backend


class EngineHost(QObject):
    stateChanged = Signal()
    loadProgress = Signal(str, int, int)
    loadFailed = Signal(str)
    loaded = Signal()
    unloaded = Signal()  # unload() is done: the model's memory and files are given back
    # Internal: from the loader thread to the UI thread.
    _loadedFromThread = Signal(object, object)  # (entry, backend)
    _failedFromThread = Signal(object, str)
    _unloadedFromThread = Signal()
    _backendState = Signal(object, str)  # (backend, "unloaded" | "loading" | "ready") from its threads

    def __init__(self, opener: Opener = open_backend, parent: QObject | None = None):
        super().__init__(parent)
        self._opener = opener
        self.backend: ChatBackend | None = None
        self.entry: ModelEntry | None = None
        self.state = "empty"
        self.error = ""
        self.progress: tuple[str, int, int] = ("", 0, 0)
        self._tasks: set[StreamTask] = set()
        self._loader: threading.Thread | None = None
        self._queued: list[ModelEntry | None] = []  # what to load when the running load ends (None: nothing)
        self._closing = False
        self.idle_unload_seconds: float | None = None  # None: the model stays loaded
        self._backendState.connect(self._on_backend_state)
        self._loadedFromThread.connect(self._on_loaded)
        self._failedFromThread.connect(self._on_failed)
        self._unloadedFromThread.connect(self._on_unloaded)
        self.loadProgress.connect(self._remember_progress)

    # -- state -------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.state == "ready" and bool(self._tasks)

    @property
    def loading(self) -> bool:
        return self._loader is not None

    def _set_state(self, state: str, error: str = "") -> None:
        self.state, self.error = state, error
        self.stateChanged.emit()

    def _remember_progress(self, stage: str, done: int, total: int) -> None:
        self.progress = (stage, done, total)

    # -- requests ------------------------------------------------------------------------------
    def track(self, task: StreamTask) -> None:
        """Count ``task`` as running (the tray shows busy) until it ends."""
        self._tasks.add(task)
        task.ended.connect(lambda: self._untrack(task))
        self.stateChanged.emit()

    def _untrack(self, task: StreamTask) -> None:
        self._tasks.discard(task)
        self.stateChanged.emit()

    # -- idle unloading ----------------------------------------------------------------------------
    def set_idle_unload(self, seconds: float | None) -> None:
        """Unload the model after ``seconds`` without requests (None: never), now and for later loads."""
        self.idle_unload_seconds = seconds
        if self.backend is not None:
            self._watch(self.backend)

    def _watch(self, backend: ChatBackend) -> None:
        backend.set_idle_unload(self.idle_unload_seconds, lambda state: self._backendState.emit(backend, state))

    def _on_backend_state(self, backend: ChatBackend, state: str) -> None:
        if backend is not self.backend or self._closing:  # a closed backend's last word
            return
        if state == "loading":  # a request arrived for the unloaded model
            self.progress = ("", 0, 0)
        self._set_state(state)

    # -- switching -------------------------------------------------------------------------------
    def switch_to(self, entry: ModelEntry) -> None:
        self._start_loader(entry)

    def unload(self) -> None:
        """Close the model and load none (state ``empty``); ``unloaded`` says when it is closed.
        Asked for while a model loads, it happens when that load ends."""
        self._start_loader(None)

    def _start_loader(self, entry: ModelEntry | None) -> None:
        if self._loader is not None:
            self._queued = [entry]  # picked up when the current load ends; the last wish wins
            return
        old, self.backend = self.backend, None
        self.entry = entry
        for task in list(self._tasks):
            task.cancel()
        self.progress = ("", 0, 0)
        self._set_state("loading" if entry is not None else "empty")
        self._loader = threading.Thread(target=self._load, args=(old, entry), name="qwen-tray-loader", daemon=True)
        self._loader.start()

    def _load(self, old: ChatBackend | None, entry: ModelEntry | None) -> None:
        """Loader thread: free the old model first, then open the new one (if any)."""
        try:
            if old is not None:
                self.loadProgress.emit("unloading", 0, 1)
                old.close()
                del old
                gc.collect()  # drop the last references to the old weights before allocating new ones
            if entry is None:
                self._unloadedFromThread.emit()
                return
            backend = self._opener(entry, progress=self.loadProgress.emit)
        except QwenTrayError as e:
            self._failedFromThread.emit(entry, str(e))
        except Exception as e:  # noqa: BLE001 - a bug; report it in the tray instead of dying silently
            log.exception("loading %s failed", entry.name if entry else "nothing")
            self._failedFromThread.emit(entry, tr("Internal error: {error}", error=f"{type(e).__name__}: {e}"))
        else:
            self._loadedFromThread.emit(entry, backend)

    def _finish_loader(self) -> bool:
        """Join the loader; start a queued switch if there is one (returns True then)."""
        if self._loader is not None:
            self._loader.join()
            self._loader = None
        if self._queued:
            self._start_loader(self._queued.pop())
            return True
        return False

    def _on_loaded(self, entry: ModelEntry, backend: ChatBackend) -> None:
        if self._closing:  # delivered after shutdown(): nobody will use it
            backend.close()
            return
        self.backend = backend
        if self._finish_loader():
            return  # switch_to closes this backend on the loader thread
        self._watch(backend)
        self._set_state("ready")
        self.loaded.emit()

    def _on_unloaded(self) -> None:
        if self._closing or self._finish_loader():
            return
        self.unloaded.emit()

    def _on_failed(self, entry: ModelEntry | None, message: str) -> None:
        if self._closing:
            return
        if self._finish_loader():
            return
        if entry is None:  # unload(): closing the model failed; it is not used any more either way
            log.warning("unloading the model: %s", message)
            self.unloaded.emit()
            return
        self._set_state("error", message)
        self.loadFailed.emit(message)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Quit: cancel requests, wait for a running load, close the backend."""
        self._queued = []
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            task.wait(timeout)
        if self._loader is not None:
            self._loader.join(timeout)
            self._loader = None
            # The loaded/failed signal is still queued: let it arrive (and close what it brings).
            from PySide6.QtCore import QCoreApplication

            QCoreApplication.sendPostedEvents(self)
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        self._set_state("empty")
