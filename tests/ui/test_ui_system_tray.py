"""The real `qwen-tray` on an X display with a system tray (Xvfb + trayer): the first start's
notice names the hotkeys it registered, once; the tray icon is there, so no chat window opens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ui_children import TIMEOUT

from app.ui.single_instance import send_request

pytestmark = [pytest.mark.x11, pytest.mark.slow]
HERE = Path(__file__).parent
REPO = HERE.parent.parent
WELCOME = ("notice: Qwen Tray is in the system tray. Select text and press Summarize Ctrl+Alt+S, Translate Ctrl+Alt+T, "
           "Extract to-dos Ctrl+Alt+D, Rewrite / polish Ctrl+Alt+R; Ctrl+Alt+Space opens the chat.")


@pytest.fixture
def display_with_a_tray():
    """A private Xvfb display whose system tray (trayer) has claimed the tray selection."""
    missing = [t for t in ("Xvfb", "trayer") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install xvfb trayer)")
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x800x24", "-nolisten", "tcp",
                             "-noreset"], pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        display = f":{f.readline().strip()}"
    trayer = subprocess.Popen(["trayer", "--edge", "top", "--align", "right"], env={**os.environ, "DISPLAY": display},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_tray_owner(display)
        yield display
    finally:
        trayer.terminate()
        trayer.wait(TIMEOUT)
        xvfb.terminate()
        xvfb.wait(TIMEOUT)


def wait_for_tray_owner(display: str) -> None:
    from Xlib import display as xdisplay

    connection = xdisplay.Display(display)
    try:
        selection = connection.intern_atom("_NET_SYSTEM_TRAY_S0")
        deadline = time.monotonic() + TIMEOUT
        while connection.get_selection_owner(selection) == 0:  # X.NONE: trayer has not claimed it yet
            assert time.monotonic() < deadline, "trayer never claimed the system tray"
            time.sleep(0.1)
    finally:
        connection.close()


def run_until_it_answers_then_quit(env: dict[str, str], model: Path) -> int:
    tray = subprocess.Popen([sys.executable, "-m", "app.cli", "tray", "--model", str(model)], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT * 2
    while (reply := send_request({"command": "ping"})) is None or reply["pid"] != tray.pid:
        assert tray.poll() is None and time.monotonic() < deadline, tray.stderr.read()[-3000:]
        time.sleep(0.2)
    send_request({"command": "quit"})
    return tray.wait(TIMEOUT)


def test_the_first_start_with_a_system_tray_names_the_hotkeys_once(display_with_a_tray, ui_home, tmp_path):
    (tmp_path / "no-model-here").mkdir()  # the tray runs without a model (and says why)
    env = {**os.environ, "DISPLAY": display_with_a_tray, "QT_QPA_PLATFORM": "xcb", "QWEN_TRAY_HOME": str(ui_home),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    assert run_until_it_answers_then_quit(env, tmp_path / "no-model-here") == 0
    log = (ui_home / "data" / "qwen-tray.log").read_text(encoding="utf-8")
    assert WELCOME in log and "no system tray found" not in log
    assert (ui_home / "config" / "settings.json").exists()

    assert run_until_it_answers_then_quit(env, tmp_path / "no-model-here") == 0
    log = (ui_home / "data" / "qwen-tray.log").read_text(encoding="utf-8")
    assert log.count(WELCOME) == 1  # the second start is not a first one
