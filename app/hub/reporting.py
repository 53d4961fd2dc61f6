"""A model job's progress on stderr, for `qwen-tray models get`: tqdm bars on a terminal, lines
in a log (a script, a service, nohup, an installer).

A log gets a line when a stage really starts (the download with its first byte, so a get
refused early, by the catalog, the disk or the hub, prints only its error), then one per tenth
of the stage's work (bytes, files), gated by the amount done and never by the clock, and each
notice (a connection that broke and is resumed) once.
"""

from __future__ import annotations

import sys
from typing import TextIO

from app.hub.progress import CONVERTING, DOWNLOADING, QUANTIZING, REGISTERING, VERIFYING, JobProgress
from app.progress import LOG_STEPS, draws_bars, format_bytes


def job_reporter(file: TextIO | None = None) -> TqdmReporter | LogReporter:
    """Bars where ``file`` (default stderr) is a terminal with a width, else lines."""
    file = file or sys.stderr
    return TqdmReporter(file) if draws_bars(file) else LogReporter(file)


class LogReporter:
    """Lines for a log: a stage's start, each tenth of it, notices."""

    _STARTS = (DOWNLOADING, CONVERTING, QUANTIZING, REGISTERING)  # checking says nothing: a refusal is its line

    def __init__(self, file: TextIO):
        self.file = file
        self.stage: str | None = None
        self.step = 0
        self.waiting: JobProgress | None = None  # a download's start, until its first byte comes

    def __enter__(self) -> LogReporter:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __call__(self, progress: JobProgress) -> None:
        if progress.notice:
            self._print(progress.notice)
            return
        if progress.stage not in self._STARTS:
            return  # checking, and the download's checksums (quick beside it)
        step = progress.done * LOG_STEPS // progress.total if progress.total > 0 else 0
        if progress.stage != self.stage:
            self.stage, self.step = progress.stage, step
            # A download starts with its first byte: a hub that refuses the first file (401,
            # 404) or cannot be reached is an early failure, one line.
            self.waiting = progress if progress.stage == DOWNLOADING else None
            if self.waiting is None:
                self._print(self._start(progress))
            return
        if self.waiting is not None:
            if progress.done <= self.waiting.done:
                return
            self._print(self._start(self.waiting))
            self.waiting = None
        if step > self.step:
            self.step = step
            self._print(self._step(progress))

    def _start(self, progress: JobProgress) -> str:
        if progress.stage == DOWNLOADING:
            have = f" ({format_bytes(progress.done)} of it already here)" if progress.done else ""
            return (f"downloading {progress.files} files, {format_bytes(progress.total)}, to "
                    f"{progress.folder}{have}")
        if progress.stage == QUANTIZING:
            return f"quantizing into {progress.folder}: {progress.total} files"
        return f"{progress.stage} {progress.detail}".rstrip()

    def _step(self, progress: JobProgress) -> str:
        percent = progress.done * 100 // progress.total
        if progress.unit == "B":
            return (f"{progress.stage}: {percent}% ({format_bytes(progress.done)} of "
                    f"{format_bytes(progress.total)})")
        detail = f" {progress.detail}" if progress.detail else ""
        return f"{progress.stage}{detail} ({progress.done}/{progress.total}, {percent}%)"

    def _print(self, line: str) -> None:
        print(line, file=self.file, flush=True)


class TqdmReporter:
    """Draws a job's progress on a terminal: one tqdm bar per stage (bytes with speed and ETA for
    the download, whose checksums show on its bar; layers for the quantizer)."""

    _UNITS = {DOWNLOADING: "B", VERIFYING: "B", QUANTIZING: "layer"}

    def __init__(self, file: TextIO):
        self.file = file
        self.bar = None
        self.stage = None

    def __enter__(self) -> TqdmReporter:
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def __call__(self, progress: JobProgress) -> None:
        from tqdm import tqdm

        if progress.notice:
            tqdm.write(progress.notice, file=self.file)  # above the bar, which stays
            return
        if progress.stage == VERIFYING and self.stage == DOWNLOADING:
            self.bar.set_postfix_str(f"checking {progress.detail}")  # one bar for the whole download
            return
        if progress.stage != self.stage:
            self._close()
            self.stage = progress.stage
            if not progress.total and progress.stage not in self._UNITS:
                return  # a short step (checking, registering): no bar
            unit = self._UNITS.get(progress.stage, progress.unit or "it")
            self.bar = tqdm(desc=progress.stage, total=progress.total or None, unit=unit, unit_scale=unit == "B",
                            unit_divisor=1024, file=self.file, initial=progress.done)
        if self.bar is None:
            return
        if progress.total and self.bar.total != progress.total:
            self.bar.total = progress.total
        self.bar.n = progress.done
        if progress.detail:
            self.bar.set_postfix_str(progress.detail, refresh=False)
        self.bar.refresh()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
