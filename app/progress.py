"""Progress of long work (load, convert, quantize) on stderr, once it takes more than a moment.

A load reports ``progress(stage, done, total)``: the stages below, in this order.
"""

from __future__ import annotations

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

Progress = Callable[[str, int, int], None]


class LineProgress:
    """Where stderr is not a terminal (a log, a pipe): one line per stage, once the work has
    taken ``delay`` seconds (a bar's redraws would fill a log)."""

    def __init__(self, description: str, file: TextIO, delay: float, clock: Callable[[], float] = time.monotonic):
        self.description, self.file, self.delay, self.clock = description, file, delay, clock
        self.started = clock()
        self.told: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.told and self.clock() - self.started >= self.delay:
            self.told = stage
            print(f"{self.description}: {stage} ({done}/{total})", file=self.file, flush=True)

    def close(self) -> None:
        """Nothing to clear: the lines stay."""


class BarProgress(LineProgress):
    """On a terminal: one tqdm bar, drawn from the first report after ``delay`` seconds."""

    def __init__(self, description: str, file: TextIO, delay: float, clock: Callable[[], float] = time.monotonic):
        super().__init__(description, file, delay, clock)
        self.bar: tqdm | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.bar is None:
            if self.clock() - self.started < self.delay:
                return
            self.bar = tqdm(desc=self.description, total=total, file=self.file, leave=False, dynamic_ncols=True)
        if self.bar.total != total:
            self.bar.reset(total=total)
        self.bar.set_postfix_str(stage, refresh=False)
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@contextmanager
def load_progress_bar(description: str, file: TextIO | None = None, delay: float | None = None) -> Iterator[Progress]:
    """Yield a ``progress(stage, done, total)`` callback that shows nothing for ``delay`` seconds
    (default :data:`PROGRESS_DELAY_S`), then a bar on a terminal, else a line per stage."""
    file = file or sys.stderr
    delay = PROGRESS_DELAY_S if delay is None else delay
    reporter = (BarProgress if _is_terminal(file) else LineProgress)(description, file, delay)
    try:
        yield reporter
    finally:
        reporter.close()


def _is_terminal(file: TextIO) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # a closed or file-like object without a terminal
        return False
