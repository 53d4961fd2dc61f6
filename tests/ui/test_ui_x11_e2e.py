"""End to end under a real X server (Xvfb): a real global hotkey, real Ctrl+C/Ctrl+V through
XTest, the real clipboard shared between two processes, and the real engine.

The user's editor (ui_x11_target.py) holds selected text and owns the clipboard (plain
text + HTML). xdotool presses Ctrl+Alt+S; the tray app (ui_x11_driver.py) copies the
selection, summarizes it with a tiny random Qwen2 model, shows it in the popup; xdotool
clicks Replace; the editor then holds the answer and the clipboard holds the user's
original content again, in both formats. Skipped where Xvfb/xdotool/xclip are missing.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.x11, pytest.mark.slow]
HERE = Path(__file__).parent
REPO = HERE.parent.parent
TOOLS = ("Xvfb", "xdotool", "xclip")
TIMEOUT = 60  # generous: the machine is shared; nothing here measures speed


@pytest.fixture(scope="module")
def xdisplay():
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install xvfb xdotool xclip)")
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                            pass_fds=(write_fd,), stderr=subprocess.DEVNULL)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        number = f.readline().strip()  # Xvfb writes the display number once it accepts clients
    if not number:
        xvfb.kill()
        pytest.skip("Xvfb did not start")
    yield f":{number}"
    xvfb.terminate()
    xvfb.wait(10)


class Child:
    """A helper process speaking JSON lines on stdout."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, *args], cwd=HERE, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))

    def wait_for(self, name: str) -> dict:
        while True:
            try:
                event = self.events.get(timeout=TIMEOUT)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {name!r} event; stderr:\n{self.proc.stderr.read()[-3000:]}") from None
            if event["event"] in ("load_failed",):
                raise AssertionError(f"model failed to load: {event}")
            if event["event"] == name:
                return event

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)


def _run(display: str, *args: str) -> str:
    return subprocess.run(list(args), env={**os.environ, "DISPLAY": display}, check=True, capture_output=True,
                          text=True, timeout=TIMEOUT).stdout


def test_hotkey_summarize_replace_and_clipboard_restored(xdisplay, tmp_path, tiny_qwen_dir):
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "ui-preferences.json").write_text(json.dumps({"max_tokens": 16, "temperature": 0}))
    env = {**os.environ, "DISPLAY": xdisplay, "QT_QPA_PLATFORM": "xcb", "QWEN_TRAY_HOME": str(home),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")])}
    target = Child(["ui_x11_target.py"], env)
    driver = None
    try:
        wid = target.wait_for("ready")["wid"]
        _run(xdisplay, "xdotool", "windowfocus", "--sync", str(wid))
        driver = Child(["ui_x11_driver.py", "--model", str(tiny_qwen_dir)], env)
        ready = driver.wait_for("ready")
        assert ready["hotkeys"]["summarize"] == "Ctrl+Alt+S" and ready["failures"] == {}

        _run(xdisplay, "xdotool", "key", "ctrl+alt+s")
        answer = driver.wait_for("answer")
        assert answer["popup_visible"] and answer["text"].strip()
        assert answer["popup_text"] == answer["text"]
        assert "tokens/s" in answer["status"]

        x, y = answer["replace"]
        _run(xdisplay, "xdotool", "mousemove", str(x), str(y), "click", "1")
        driver.wait_for("pasted")
        target.send("text")
        field = target.wait_for("text")["text"]
        assert field == answer["text"].replace("\r\n", "\n").replace("\r", "\n")  # the selection was replaced

        from ui_x11_target import CLIPBOARD_HTML, CLIPBOARD_TEXT

        assert _run(xdisplay, "xclip", "-o", "-selection", "clipboard") == CLIPBOARD_TEXT
        assert _run(xdisplay, "xclip", "-o", "-selection", "clipboard", "-t", "text/html") == CLIPBOARD_HTML
    finally:
        if driver is not None:
            driver.stop()
        target.stop()


def test_x11_hotkey_conflict_is_reported(xdisplay, monkeypatch):
    monkeypatch.setenv("DISPLAY", xdisplay)
    from app.ui.platform.hotkeys_x11 import X11Hotkeys
    from app.settings.keys import HotkeyConflictError, parse_hotkey

    first, second = X11Hotkeys(lambda b: None), X11Hotkeys(lambda b: None)
    try:
        first.register("summarize", parse_hotkey("Ctrl+Alt+S"))
        with pytest.raises(HotkeyConflictError, match="already taken"):
            second.register("mine", parse_hotkey("Ctrl+Alt+S"))
        second.register("other", parse_hotkey("Ctrl+Alt+T"))  # the refused grab left nothing half-registered
        first.unregister_all()
        second.register("mine", parse_hotkey("Ctrl+Alt+S"))  # free again once released
    finally:
        first.close()
        second.close()


def test_x11_hotkey_fires_once_per_press(xdisplay, monkeypatch):
    monkeypatch.setenv("DISPLAY", xdisplay)
    from app.ui.platform.hotkeys_x11 import X11Hotkeys
    from app.settings.keys import parse_hotkey

    fired: queue.Queue = queue.Queue()
    hotkeys = X11Hotkeys(fired.put)
    try:
        hotkeys.register("translate", parse_hotkey("Ctrl+Alt+T"))
        _run(xdisplay, "xdotool", "key", "ctrl+alt+t", "ctrl+alt+t")
        # Held long enough for X auto-repeat (a stream of release+press pairs): still one activation.
        _run(xdisplay, "xdotool", "keydown", "ctrl+alt+t", "sleep", "1.5", "keyup", "ctrl+alt+t")
        assert [fired.get(timeout=TIMEOUT) for _ in range(3)] == ["translate"] * 3
        _run(xdisplay, "xdotool", "key", "ctrl+alt+x")  # not registered: nothing fires
        hotkeys.register("sentinel", parse_hotkey("Ctrl+Alt+Y"))
        _run(xdisplay, "xdotool", "key", "ctrl+alt+y")
        assert fired.get(timeout=TIMEOUT) == "sentinel"  # nothing came between the third press and this one
    finally:
        hotkeys.close()
