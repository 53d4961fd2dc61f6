"""Progress of long work (load, convert, quantize) on stderr, once it takes more than a moment.

A load reports ``progress(stage, done, total)``: the stages below, in this order.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from tqdm import tqdm

# The load stage that reads the weights: done / total are decoder layers.
LAYERS_STAGE = "layers"
# The load stage after the weights are read: the kernels taken from CuPy's disk cache and the CUDA
# graphs captured; done / total are kernel instances.
GPU_STAGE = "preparing the GPU"
# ... when the kernels are compiled (a first load, or the first after they changed): done / total
# are kernel instances (app.kernels.builds), the total a guess on a machine's very first build.
KERNELS_STAGE = "building GPU kernels (first run)"
# Work that ends sooner than this shows nothing: a bar flashing by is noise.
PROGRESS_DELAY_S = 1.0
# A log gets a line per this fraction of a long stage (a conversion, a quantization): 10 %.
LOG_STEPS = 10

Progress = Callable[[str, int, int], None]


class LineProgress:
    """Where stderr is not a terminal (a log, a pipe): lines instead of a bar's redraws, once the
    work has taken ``delay`` seconds: one per stage (a load's few stages) or, with ``steps`` (one
    long piece of work: a conversion's tensors, a quantization's files), one each time another
    1/steps of it is done, whatever file the stage names: the log shows the work advancing,
    gated by the amount done, not by the clock."""

    def __init__(self, description: str, file: TextIO, delay: float, clock: Callable[[], float] = time.monotonic,
                 steps: int = 0):
        self.description, self.file, self.delay, self.clock, self.steps = description, file, delay, clock, steps
        self.started = clock()
        self.told: str | None = None
        self.told_step = -1

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.clock() - self.started < self.delay:
            return
        if self.steps:
            step = done * self.steps // total if total > 0 else 0
            if step <= self.told_step:
                return
            self.told_step = step
        elif stage == self.told:
            return
        self.told = stage
        print(f"{self.description}: {stage} ({done}/{total})", file=self.file, flush=True)

    def close(self) -> None:
        """Nothing to clear: the lines stay."""


class BarProgress(LineProgress):
    """On a terminal: one tqdm bar, drawn from the first report after ``delay`` seconds."""

    def __init__(self, description: str, file: TextIO, delay: float, clock: Callable[[], float] = time.monotonic,
                 steps: int = 0):
        super().__init__(description, file, delay, clock, steps)
        self.bar: tqdm | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bar is None:
            if self.clock() - self.started < self.delay:
                return
            # initial: what was done before the bar (a resumed quantization's finished files) is
            # not counted in its rate
            self.bar = tqdm(desc=self.description, total=total, file=self.file, leave=False, dynamic_ncols=True,
                            initial=done)
        if self.bar.total != total:
            self.bar.reset(total=total)
            self.bar.initial = done  # a new stage: its rate counts from where it starts
        self.bar.set_postfix_str(stage, refresh=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextmanager
def load_progress_bar(description: str, file: TextIO | None = None, delay: float | None = None,
                      steps: int = 0) -> Iterator[Progress]:
    """Yield a ``progress(stage, done, total)`` callback that shows nothing for ``delay`` seconds
    (default :data:`PROGRESS_DELAY_S`), then a bar on a terminal, else a line per stage (and per
    1/``steps`` of the work, with ``steps``)."""
    file = file or sys.stderr
    delay = PROGRESS_DELAY_S if delay is None else delay
    reporter = (BarProgress if draws_bars(file) else LineProgress)(description, file, delay, steps=steps)
    try:
        yield reporter
    finally:
        reporter.close()


def draws_bars(file: TextIO) -> bool:
    """True where a redrawn bar can be seen: a terminal with a width. A pseudo-terminal of 0
    columns (`script` started from a service, some IDE consoles) gets lines, where tqdm would draw
    nothing at all."""
    try:
        return file.isatty() and os.get_terminal_size(file.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # closed, file-like without a descriptor, no size
        return False


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # unreachable: the loop returns at GB
