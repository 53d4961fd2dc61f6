"""Terminal progress bars for long work (load, convert, quantize), silent when not a TTY."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm import tqdm

# The load stage that reads the weights: done / total are decoder layers.
LAYERS_STAGE = "layers"
# The load stage after the weights are read: moving them to the GPU, compiling the kernels (the
# first run; cached on disk after it) and capturing the CUDA graphs. One step, no percentage.
GPU_STAGE = "preparing the GPU"


@contextmanager
def load_progress_bar(description: str) -> Iterator:
    """Yield a ``progress(stage, done, total)`` callback that drives one tqdm bar on stderr."""
    bar = tqdm(desc=description, unit="tensor", file=sys.stderr, disable=None, leave=False)

    def progress(stage: str, done: int, total: int) -> None:
        if bar.total != total:
            bar.reset(total=total)
        bar.set_postfix_str(stage, refresh=False)
        bar.n = done
        bar.refresh()

    try:
        yield progress
    finally:
        bar.close()
