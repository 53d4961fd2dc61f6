"""A private X server (Xvfb) for the X11 tests, commands run on it, and the environment of the
tray and the targets started there (conftest.py's ``xdisplay`` fixture starts one per module)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ui_children import TIMEOUT

HERE = Path(__file__).parent
REPO = HERE.parent.parent
TOOLS = ("Xvfb", "xdotool", "xclip")


@contextmanager
def private_display() -> Iterator[str]:
    """A fresh Xvfb; its display name (":N"). Skips the test where the tools are missing."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install xvfb xdotool xclip)")
    read_fd, write_fd = os.pipe()
    # -noreset: the server would otherwise reset when its last client leaves, refusing the next one meanwhile.
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x800x24", "-nolisten", "tcp",
                             "-noreset"],
                            pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        number = f.readline().strip()  # Xvfb writes the display number once it accepts clients
    if not number:
        xvfb.kill()
        pytest.skip("Xvfb did not start")
    try:
        yield f":{number}"
    finally:
        xvfb.terminate()
        xvfb.wait(10)


def run_x(display: str, *args: str) -> str:
    """Run a command (xdotool, xclip) on ``display``; its stdout."""
    return subprocess.run(list(args), env={**os.environ, "DISPLAY": display}, check=True, capture_output=True,
                          text=True, timeout=TIMEOUT).stdout


def press_like_a_person(display: str, letter: str, hold_s: float) -> None:
    """Ctrl+Alt+letter: modifiers down, the letter held ``hold_s``, the letter up, then the modifiers."""
    run_x(display, "xdotool", "keydown", "ctrl", "alt", letter, "sleep", str(hold_s), "keyup", letter,
          "sleep", "0.06", "keyup", "alt", "ctrl")


def tray_env(display: str, home: Path) -> dict[str, str]:
    """The environment of the tray (ui_x11_driver.py) and the targets: the display, Qt on X11, its own settings."""
    return {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "QWEN_TRAY_HOME": str(home),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
