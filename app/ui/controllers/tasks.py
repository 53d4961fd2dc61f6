"""Run blocking model work (streaming a generation) on a thread, report through Qt signals.

Signals emitted from the worker thread reach slots on the UI thread through queued
connections, so widgets are only ever touched by the UI thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from app.engine.params import GenerationResult
from app.errors import QwenTrayError
from app.ui.i18n import tr
from app.ui.pipeline import Sink

log = logging.getLogger(__name__)


class StreamTask(QObject):
    """One background job that streams text: ``job(sink) -> GenerationResult``."""

    delta = Signal(str)
    progress = Signal(str, int, int)
    finished = Signal(object)  # GenerationResult
    failed = Signal(str)
    ended = Signal()  # after finished or failed, always

    def __init__(self, job: Callable[[Sink], GenerationResult], cancel: Callable[[], None],
                 parent: QObject | None = None):
        super().__init__(parent)
        self._job, self._cancel = job, cancel
        self._thread = threading.Thread(target=self._run, name="qwen-tray-stream", daemon=True)
        self.cancelled = False

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancelled = True
        self._cancel()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            result = self._job(Sink(self.delta.emit, self.progress.emit))
        except QwenTrayError as e:
            self.failed.emit(str(e))
        except Exception as e:  # noqa: BLE001 - a bug; keep the UI alive and log the traceback
            log.exception("background task failed")
            self.failed.emit(tr("Internal error: {error}", error=f"{type(e).__name__}: {e}"))
        else:
            self.finished.emit(result)
        self.ended.emit()
