"""Progress of a model job (download, verify, convert, quantize) with its rate and ETA, and cancel.

The job reports :class:`JobProgress` through a plain callback; the CLI draws tqdm bars from
it, the tray turns it into Qt signals. Cancelling sets an Event that the job checks between
chunks and layers; what is done so far stays for the next run to resume.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from app.errors import QwenTrayError

# Stages, in the order a job runs them.
CHECKING, DOWNLOADING, VERIFYING, CONVERTING, QUANTIZING, REGISTERING = (
    "checking", "downloading", "verifying", "converting", "quantizing", "registering")
RATE_WINDOW_S = 20.0  # the rate is measured over the last this many seconds


class JobCancelled(QwenTrayError):
    """The user cancelled; what was done stays and the next run resumes from it."""


@dataclass(frozen=True)
class JobProgress:
    stage: str
    done: int = 0
    total: int = 0
    unit: str = ""  # "B" for bytes, else the things counted ("layer", "tensor")
    rate: float | None = None  # units per second
    eta_s: float | None = None
    detail: str = ""  # the file or layer being worked on
    files: int = 0  # how many files the stage writes (the download's, the quantizer's)
    folder: str = ""  # where the stage writes them
    notice: str = ""  # something to tell once, beside the progress (a connection resumed)

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total > 0 else None


Reporter = Callable[[JobProgress], None]


class RateMeter:
    """Counts work done for one stage and derives its rate and ETA over a sliding window."""

    def __init__(self, stage: str, total: int, unit: str, report: Reporter, cancel: threading.Event | None,
                 done: int = 0, clock: Callable[[], float] = time.monotonic, files: int = 0, folder: str = ""):
        self.stage, self.total, self.unit, self.done = stage, total, unit, done
        self.files, self.folder = files, folder
        self._report, self._cancel, self._clock = report, cancel, clock
        self._samples: deque[tuple[float, int]] = deque([(clock(), done)])
        self.detail = ""
        self._lock = threading.Lock()

    def start_at(self, done: int) -> None:
        """Count from ``done`` without a report: work an earlier run did (a resumed quantization)
        is not this run's, so the rate and ETA are measured from here."""
        with self._lock:
            self.done = done
            self._samples = deque([(self._clock(), done)])

    def check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise JobCancelled("cancelled")

    def add(self, n: int, detail: str | None = None, *, check: bool = True) -> None:
        self.set(self.done + n, detail, check=check)

    def set(self, done: int, detail: str | None = None, *, check: bool = True) -> None:
        """Record ``done`` units (reported at once); raises JobCancelled when cancel was asked
        (unless ``check`` is False: the caller checks where stopping loses nothing)."""
        with self._lock:
            self.done = done
            if detail is not None:
                self.detail = detail
            now = self._clock()
            self._samples.append((now, done))
            while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_S:
                self._samples.popleft()
            progress = self.snapshot()
        self._report(progress)
        if check:
            self.check_cancel()

    def tell(self, notice: str) -> None:
        """Report ``notice`` once, with the progress as it is."""
        with self._lock:
            progress = replace(self.snapshot(), notice=notice)
        self._report(progress)

    def snapshot(self) -> JobProgress:
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        rate = (d1 - d0) / (t1 - t0) if t1 > t0 and d1 > d0 else None
        eta = (self.total - self.done) / rate if rate and self.total >= self.done else None
        return JobProgress(self.stage, self.done, self.total, self.unit, rate, eta, self.detail, self.files,
                           self.folder)


def format_size_gb(n: float) -> str:
    """A model's size in the catalog (CLI and Settings): always GB with one decimal, so a column
    compares at a glance ("0.8 GB" beside "1.6 GB", never "796.2 MB")."""
    return "<0.1 GB" if 0 < n < 0.05e9 else f"{n / 1e9:.1f} GB"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
