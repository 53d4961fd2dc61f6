"""Model jobs (download -> quantize -> register, a GGUF import) on a worker thread, one at a time.

The tray keeps answering meanwhile: the job never touches the engine host. Its progress,
result and failure reach the UI thread as Qt signals (queued connections). Cancel stops it at
the next chunk or layer; what was done stays and the next start of the same job resumes it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from PySide6.QtCore import QObject, Signal

from app.engine.cuda.fit import Machine
from app.errors import QwenTrayError
from app.hub.errors import HubUnreachableError
from app.hub.job import GotModel
from app.hub.progress import JobCancelled, JobProgress, Reporter
from app.ui.i18n import tr

log = logging.getLogger(__name__)


# What to try when the source does not answer, in the Settings fields' own words.
MODELSCOPE_ENDPOINT_ADVICE = ("check the network, the proxy and MODELSCOPE_ENDPOINT, or choose Hugging Face in "
                              "“{source}”")
MODELSCOPE_ADVICE = ("check the network or the proxy, or choose Hugging Face in “{source}” (with a “{mirror}” if "
                     "needed)")
HF_MIRROR_ADVICE = ("check the network, the proxy and the address in “{mirror}”, or clear it to use "
                    "huggingface.co, or choose ModelScope in “{source}”")
HF_ADVICE = ("check the network or the proxy, or enter a mirror in “{mirror}” (e.g. https://hf-mirror.com), or "
             "choose ModelScope in “{source}”")


def unreachable_advice(error: HubUnreachableError) -> str:
    fields = {"source": tr("Download from"), "mirror": tr("Hugging Face mirror")}
    if error.source == "modelscope":
        if error.custom_endpoint:
            return tr(MODELSCOPE_ENDPOINT_ADVICE, **fields)
        return tr(MODELSCOPE_ADVICE, **fields)
    return tr(HF_MIRROR_ADVICE, **fields) if error.custom_endpoint else tr(HF_ADVICE, **fields)


class ModelJob(Protocol):
    def run(self, report: Reporter, cancel: threading.Event | None = None) -> GotModel: ...


class ModelJobs(QObject):
    progress = Signal(object)  # JobProgress
    finished = Signal(object, bool)  # GotModel, make it the active model
    failed = Signal(str)
    cancelled = Signal()
    runningChanged = Signal(bool)
    # Internal: from the worker thread to the UI thread.
    _ended = Signal()

    def __init__(self, machine: Callable[[], Machine | None] = lambda: None, parent: QObject | None = None):
        super().__init__(parent)
        self.machine = machine  # where the tray would run a model (the catalog's "fits" column)
        self.label = ""  # what the running job makes, for the UI
        self.last_progress: JobProgress | None = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._ended.connect(self._join)
        self.progress.connect(self._remember)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, job: ModelJob, label: str, activate: bool = False) -> bool:
        """Run ``job`` unless one is running (False then)."""
        if self._thread is not None:
            return False
        self.label, self.last_progress = label, None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(job, activate, self._cancel),
                                        name="qwen-tray-model-job", daemon=True)
        self._thread.start()
        self.runningChanged.emit(True)
        return True

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def shutdown(self, timeout: float = 30.0) -> None:
        """Quit: cancel the job and wait for it to stop (what it did is kept for the next run)."""
        self.cancel()
        self.wait(timeout)

    def _run(self, job: ModelJob, activate: bool, cancel: threading.Event) -> None:
        try:
            got = job.run(self.progress.emit, cancel)
        except JobCancelled:
            self.cancelled.emit()
        except HubUnreachableError as e:
            self.failed.emit(str(e.advised(unreachable_advice(e), tr("“Download and quantize” resumes it"))))
        except QwenTrayError as e:
            self.failed.emit(str(e))
        except Exception as e:  # noqa: BLE001 - a bug; keep the tray alive and log the traceback
            log.exception("model job failed")
            self.failed.emit(tr("Internal error: {error}", error=f"{type(e).__name__}: {e}"))
        else:
            self.finished.emit(got, activate)
        self._ended.emit()

    def _remember(self, progress: JobProgress) -> None:
        self.last_progress = progress

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.runningChanged.emit(False)
