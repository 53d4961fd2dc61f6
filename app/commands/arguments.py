"""Argparse types and notes for the commands' options: a bad value is refused while the command
line is parsed, naming the option, on every machine (not only where the value would be used)."""

from __future__ import annotations

import argparse
import sys


def memory_size(text: str) -> int:
    """An argparse type: bytes from '3.2GiB', '3200MiB', '800M' or plain bytes (``--vram-budget``).

    Parsed on a machine without a GPU too, where the value then does nothing: a typo is
    refused here rather than accepted there and refused on the laptop with the GPU.
    """
    from app.engine.cuda.memory import size_in_bytes  # imports torch: only when the option is given

    try:
        return size_in_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def note_unused_vram_budget(vram_budget: int | None, device: str) -> None:
    """One line on stderr when ``--vram-budget`` was given but the model runs on the CPU."""
    if vram_budget is not None and device == "cpu":
        print("qwen-tray: note: --vram-budget has no effect here: the model runs on the CPU", file=sys.stderr)
