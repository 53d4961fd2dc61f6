"""The user's clipboard outlives the tray on X11 (app/ui/platform/clipboard_keeper.py), under a
real X server (Xvfb) with the real tray (ui_x11_driver.py), a real hotkey pressed like a person
and the user's editor (ui_x11_target.py) as another process.

After an action the tray owns the clipboard (it put the user's clipboard back). Without a
clipboard manager, quitting hands it to a keeper process: a third process (xclip) still reads
the user's text and HTML, and the keeper ends once another program takes the clipboard. With a
clipboard manager (ui_x11_clipboard_manager.py) no keeper starts: Qt hands the clipboard to the
manager at exit, as before. SIGTERM quits the real tray the way its menu does (so this happens
on `kill` too). Skipped where Xvfb/xdotool/xclip are missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ui_children import TIMEOUT, Child
from ui_x11_display import REPO, press_like_a_person, run_x, tray_env
from ui_x11_target import CLIPBOARD_HTML, CLIPBOARD_TEXT

from app.ui.platform.clipboard import ClipboardSnapshot
from app.ui.platform.clipboard_keeper import MODULE, keeper_payload
from app.ui.single_instance import send_request

pytestmark = [pytest.mark.x11, pytest.mark.slow]


def keepers_on(display: str) -> list[int]:
    """The clipboard keeper processes running on ``display`` (an ended one not yet reaped is not)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue  # not a process, or it ended meanwhile
        if MODULE.encode() in cmdline and f"DISPLAY={display}".encode() in environ and state != "Z":
            pids.append(int(proc.name))
    return pids


def wait_until_ended(pid: int, display: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while pid in keepers_on(display):
        assert time.monotonic() < deadline, f"the clipboard keeper {pid} is still running"
        time.sleep(0.05)


@pytest.fixture
def tray_that_put_the_clipboard_back(xdisplay, tmp_path, tiny_qwen_dir):
    """The tray after a hotkey action put the user's clipboard back, the editor it came from gone:
    the tray owns the user's clipboard. Yields the tray (ui_x11_driver.py) and its environment."""
    (tmp_path / "home" / "config").mkdir(parents=True)
    (tmp_path / "home" / "config" / "ui-preferences.json").write_text(json.dumps({"max_tokens": 8}))
    env = tray_env(xdisplay, tmp_path / "home")
    tray = Child(["ui_x11_driver.py", "--model", str(tiny_qwen_dir)], env)
    editor = Child(["ui_x11_target.py"], env)
    try:
        assert tray.wait_for("ready")["failures"] == {}
        wid = editor.wait_for("ready")["wid"]
        run_x(xdisplay, "xdotool", "windowfocus", "--sync", str(wid))
        press_like_a_person(xdisplay, "s", 0.2)
        assert tray.wait_for("captured")["origin"] == "selection"  # the copy changed the clipboard...
        tray.wait_for("answer")
        run_x(xdisplay, "xdotool", "key", "Escape")
        tray.wait_for("popup_closed")
        editor.stop()
        # ...and the tray put it back: it owns it now, the editor that owned it is gone.
        assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == CLIPBOARD_TEXT
        yield tray, env
    finally:
        editor.stop()
        tray.stop()


def test_the_users_clipboard_outlives_the_tray_until_another_program_takes_it(xdisplay,
                                                                              tray_that_put_the_clipboard_back):
    tray, env = tray_that_put_the_clipboard_back
    assert keepers_on(xdisplay) == []
    tray.proc.send_signal(signal.SIGTERM)  # `kill`: it quits as from its menu
    assert tray.proc.wait(TIMEOUT) == 0
    keepers = keepers_on(xdisplay)
    try:
        assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == CLIPBOARD_TEXT
        assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard", "-t", "text/html") == CLIPBOARD_HTML
        assert len(keepers) == 1
        assert tray.wait_for("log")["text"].startswith(f"the clipboard is kept by process {keepers[0]} after quitting")

        other = Child(["ui_x11_target.py"], env)  # another program: it takes the clipboard as it starts
        try:
            other.wait_for("ready")
            other.command("clip-text copied after the tray quit")
            wait_until_ended(keepers[0], xdisplay)
            assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == "copied after the tray quit"
        finally:
            other.stop()
    finally:
        for pid in keepers_on(xdisplay):
            os.kill(pid, signal.SIGTERM)  # (only when the test failed)


@pytest.fixture
def clipboard_manager(xdisplay):
    manager = Child(["ui_x11_clipboard_manager.py"], {**os.environ, "DISPLAY": xdisplay})
    try:
        manager.wait_for("ready")
        yield manager
    finally:
        manager.stop()


def test_with_a_clipboard_manager_qt_hands_it_the_clipboard_and_no_keeper_starts(xdisplay, clipboard_manager,
                                                                                tray_that_put_the_clipboard_back):
    tray, _env = tray_that_put_the_clipboard_back
    tray.send("quit")
    assert tray.proc.wait(TIMEOUT) == 0
    assert "text/html" in clipboard_manager.wait_for("saved")["targets"]
    assert [e for e in tray.seen if e["event"] == "log"] == []
    assert keepers_on(xdisplay) == []
    assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == CLIPBOARD_TEXT
    assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard", "-t", "text/html") == CLIPBOARD_HTML


def test_a_keeper_late_to_start_leaves_a_clipboard_taken_meanwhile_alone(xdisplay, tmp_path):
    """Another program took the clipboard between the tray's look and the keeper's start: that
    content is the user's now, not the tray's older one."""
    editor = Child(["ui_x11_target.py"], tray_env(xdisplay, tmp_path))  # it owns the clipboard
    try:
        editor.wait_for("ready")
        payload = keeper_payload(ClipboardSnapshot((("text/plain", b"the tray's older content"),), ""), 0x7FFFFF)
        keeper = subprocess.run([sys.executable, "-m", MODULE], input=payload, capture_output=True, timeout=TIMEOUT,
                                env={**os.environ, "DISPLAY": xdisplay}, cwd=REPO)
        assert (keeper.returncode, keeper.stdout) == (0, b"the clipboard changed hands meanwhile: nothing to keep\n")
        assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == CLIPBOARD_TEXT
    finally:
        editor.stop()


def test_sigterm_quits_the_real_tray_like_its_menu(xdisplay, ui_home, tmp_path):
    """`kill` (a session or service manager) ends `qwen-tray` through its shutdown, exit status 0."""
    (tmp_path / "no-model-here").mkdir()  # the tray runs without a model (and says why)
    env = tray_env(xdisplay, ui_home)
    tray = subprocess.Popen([sys.executable, "-m", "app.cli", "tray", "--model", str(tmp_path / "no-model-here")],
                            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while (reply := send_request({"command": "ping"})) is None or reply["pid"] != tray.pid:
        assert tray.poll() is None and time.monotonic() < deadline, tray.stderr.read()[-3000:]
        time.sleep(0.2)
    tray.send_signal(signal.SIGTERM)
    assert tray.wait(TIMEOUT) == 0, tray.stderr.read()[-3000:]
