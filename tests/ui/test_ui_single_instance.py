"""One tray per user and settings folder, and `qwen-tray action`, with real second processes.

The trays run offscreen without an X display (no hotkeys grabbed); each test has its own
QWEN_TRAY_HOME, so its lock and socket are its own. `qwen-tray` is the real CLI; the tray that
answers `qwen-tray action` is ui_x11_driver.py on the fake backend (its events show what
reached the popup), which serves requests exactly as run_tray does.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ui_children import TIMEOUT, Child

from app.errors import QwenTrayError
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore
from app.ui.single_instance import InstanceLock, lock_path, send_request

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
REPO = HERE.parent.parent


@pytest.fixture
def env(ui_home) -> dict[str, str]:
    """The environment of a user's processes: this test's settings folder, no X display."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(QWEN_TRAY_HOME=str(ui_home), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    return env


def qwen_tray(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, input=stdin, capture_output=True,
                          text=True, timeout=TIMEOUT * 2, cwd=REPO)


def start_tray(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)


def answering_pid(proc: subprocess.Popen) -> int:
    """The pid of the tray that answers, once ``proc`` does (fails if it exits first)."""
    deadline = time.monotonic() + TIMEOUT * 2
    while time.monotonic() < deadline:
        reply = send_request({"command": "ping"})
        if reply is not None and reply["pid"] == proc.pid:
            return reply["pid"]
        assert proc.poll() is None, f"the tray exited ({proc.returncode}): {proc.stderr.read()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError("the tray never answered")


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        send_request({"command": "quit"})
    try:
        return proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(TIMEOUT)
        raise


def test_a_second_qwen_tray_hands_over_and_exits_then_replace_restarts(env, tmp_path):
    (tmp_path / "no-model-here").mkdir()  # a folder, not a model: the tray runs (and says the load failed)
    model = ["tray", "--model", str(tmp_path / "no-model-here")]
    first = start_tray(env, *model)
    second = third = None
    try:
        answering_pid(first)
        second = qwen_tray(env)
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip() == f"Qwen Tray is already running (process {first.pid}): it opened its chat window"
        assert first.poll() is None and send_request({"command": "ping"})["pid"] == first.pid
        chinese = qwen_tray(env, "--language", "zh_CN")  # the UI is not translated again while it runs
        assert chinese.returncode == 0, chinese.stderr
        assert chinese.stdout.strip() == (
            f"Qwen Tray is already running (process {first.pid}): it opened its chat window; it keeps its "
            "language (English): `qwen-tray --language zh_CN --replace` restarts it in Simplified Chinese")
        same = qwen_tray(env, "--language", "en")
        assert same.stdout.strip().endswith(": it opened its chat window")

        third = start_tray(env, *model, "--replace")
        assert first.wait(TIMEOUT) == 0  # asked to quit, it quit cleanly
        answering_pid(third)
        assert stop(third) == 0
        assert send_request({"command": "ping"}) is None  # gone, and it gave the lock up
        assert InstanceLock().try_claim()
    finally:
        for proc in (first, third):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_a_tray_killed_outright_leaves_nothing_in_the_way(env, tmp_path):
    (tmp_path / "no-model-here").mkdir()
    first = start_tray(env, "tray", "--model", str(tmp_path / "no-model-here"))
    answering_pid(first)
    assert lock_path().exists()
    first.send_signal(signal.SIGKILL)
    first.wait(TIMEOUT)
    assert lock_path().exists()  # left behind, with a socket file: both are taken over
    again = start_tray(env, "tray", "--model", str(tmp_path / "no-model-here"))
    try:
        answering_pid(again)
    finally:
        assert stop(again) == 0


@pytest.fixture
def running_tray(env):
    """The tray (fake backend: answers "Summary: <last three words>"), up and with its model."""
    tray = Child(["ui_x11_driver.py", "--fake"], env)
    try:
        tray.wait_for("ready")
        yield tray
    finally:
        tray.stop()


def test_qwen_tray_action_runs_on_given_text_and_streams_into_the_popup(env, running_tray):
    done = qwen_tray(env, "action", "summarize", "--text", "The budget review moved to Friday afternoon.")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "Summarize runs on the given text; the answer shows in its popup\n"
    captured = running_tray.wait_for("captured")
    assert (captured["origin"], captured["text"]) == ("given", "The budget review moved to Friday afternoon.")
    answer = running_tray.wait_for("answer")
    assert answer["popup_visible"] and answer["popup_text"] == answer["text"] == "Summary: to Friday afternoon."
    assert answer["source"] == "Given text: The budget review moved to Friday afternoon."
    assert not answer["replace_enabled"]  # not the selection: nothing to replace

    piped = qwen_tray(env, "action", "translate", "-", stdin="会议改到周五下午三点。\n")
    assert piped.returncode == 0, piped.stderr
    assert running_tray.wait_for("captured")["text"] == "会议改到周五下午三点。\n"
    running_tray.wait_for("answer")


def test_qwen_tray_action_from_a_windows_shortcut_runs_without_a_console_and_exits_0(env, running_tray):
    """The shortcut runs `pythonw.exe -m app.cli action NAME`: stdin, stdout and stderr are None
    (tests/test_cli_console.py: its errors go to the log)."""
    code = ("import sys\n"
            "sys.stdin = sys.stdout = sys.stderr = None\n"
            "from app.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", code, "action", "summarize", "--text", "Invoices are due on the 30th."],
                          env=env, capture_output=True, text=True, timeout=TIMEOUT * 2, cwd=REPO)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")  # (was: AttributeError on flush, exit 1)
    assert running_tray.wait_for("captured")["text"] == "Invoices are due on the 30th."
    running_tray.wait_for("answer")


def test_on_windows_the_hand_over_lets_the_tray_take_the_foreground(running_tray, monkeypatch):
    """AllowSetForegroundWindow(the tray's pid) before `activate` (a second start) and `action`, so
    the tray's window comes to the front despite Windows' foreground lock; nothing elsewhere, nor
    without a tray. The Windows call is injected; the hand-over code around it is the real one."""
    from app.commands import action
    from app.ui import single_instance

    allowed: list[int] = []
    real = single_instance.hand_foreground_to
    monkeypatch.setattr(single_instance, "hand_foreground_to", lambda lock: real(lock, "win32", allowed.append))
    tray_pid = send_request({"command": "ping"})["pid"]
    assert single_instance.claim_instance([]) is None  # handed over to the running tray
    assert action.run(argparse.Namespace(list=False, name="summarize", stdin=None, text="Invoices are due.")) == 0
    assert allowed == [tray_pid, tray_pid]
    running_tray.wait_for("answer")
    real(InstanceLock(), "linux", allowed.append)  # elsewhere: no such call
    real(InstanceLock("qwen-tray-nobody-holds-this"), "win32", allowed.append)  # no tray: nobody to hand it to
    assert allowed == [tray_pid, tray_pid]


def test_qwen_tray_action_sent_while_the_model_loads_runs_once_it_is_ready(env, tiny_qwen_dir):
    """A desktop shortcut pressed right after login: the real model's load is in progress."""
    tray = Child(["ui_x11_driver.py", "--model", str(tiny_qwen_dir), "--hold-load"], env)
    try:
        tray.wait_for("loading")
        action = subprocess.Popen([sys.executable, "-m", "app.cli", "action", "summarize", "--text",
                                   "The budget review moved to Friday afternoon."], env=env, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        captured = tray.wait_for("captured")  # taken at the request, not when the load ends
        assert (captured["origin"], captured["text"]) == ("given", "The budget review moved to Friday afternoon.")
        assert tray.wait_for("notice")["text"] == "Summarize runs once test model is loaded"
        assert send_request({"command": "ping"})["message"] == "model test model: loading"
        tray.send("release-load")
        out, err = action.communicate(timeout=TIMEOUT * 2)
        assert (action.returncode, err) == (0, "")
        assert out == "Summarize runs on the given text; the answer shows in its popup\n"
        assert tray.wait_for("answer")["popup_visible"]
        events = [e["event"] for e in tray.seen]
        assert events.index("captured") < events.index("ready") < events.index("answer")
    finally:
        tray.stop()


def test_qwen_tray_action_sent_while_a_load_fails_gets_the_loads_error(env, tmp_path):
    (tmp_path / "no-model-here").mkdir()
    tray = Child(["ui_x11_driver.py", "--model", str(tmp_path / "no-model-here"), "--hold-load"], env)
    try:
        tray.wait_for("loading")
        action = subprocess.Popen([sys.executable, "-m", "app.cli", "action", "summarize", "--text", "Some words."],
                                  env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert tray.wait_for("notice")["text"] == "Summarize runs once test model is loaded"
        assert send_request({"command": "ping"})["message"] == "model test model: loading"
        tray.send("release-load")
        out, err = action.communicate(timeout=TIMEOUT * 2)
        assert (action.returncode, out) == (1, "")
        assert err.startswith("qwen-tray: error: the model could not be loaded, so Summarize did not run: ")
        assert "no-model-here" in err and len(err.strip().splitlines()) == 1
        assert not any(e["event"] == "answer" for e in tray.seen)
    finally:
        tray.stop()


def test_qwen_tray_action_takes_an_actions_name_as_well_as_its_id(env):
    """A user action named in Chinese has an id like user-action; its name runs it too."""
    from app.settings.actions import Action

    with SettingsStore().edit() as settings:
        settings.actions = [Action(id="user-action", name="总结要点", prompt="要点：{text}")]
    tray = Child(["ui_x11_driver.py", "--fake"], env)
    try:
        tray.wait_for("ready")
        done = qwen_tray(env, "action", "总结要点", "--text", "会议改到周五下午。")
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout == "总结要点 runs on the given text; the answer shows in its popup\n"
        assert tray.wait_for("captured")["text"] == "会议改到周五下午。"
        tray.wait_for("answer")
        for name in ("总结", "SUMMARIZE"):  # a built-in's Chinese name, its English one in any case
            done = qwen_tray(env, "action", name, "--text", "Invoices are due on the 30th.")
            assert done.stdout == "Summarize runs on the given text; the answer shows in its popup\n", done.stderr
            tray.wait_for("answer")
    finally:
        tray.stop()


def test_qwen_tray_action_errors_are_one_line(env, running_tray):
    unknown = qwen_tray(env, "action", "summarise", "--text", "x")
    assert unknown.returncode == 1
    assert unknown.stderr == "qwen-tray: error: there is no action 'summarise' (`qwen-tray action --list` shows them)\n"
    empty = qwen_tray(env, "action", "summarize", "-", stdin="  \n")
    assert (empty.returncode, empty.stderr) == (1, "qwen-tray: error: the text to work on is empty\n")


def test_qwen_tray_action_without_a_running_tray(env):
    done = qwen_tray(env, "action", "summarize", "--text", "hello")
    assert done.returncode == 1
    assert done.stderr == ("qwen-tray: error: Qwen Tray is not running: start it first (`qwen-tray`); "
                           "`qwen-tray action --list` works without it\n")


def test_action_list_needs_no_tray_and_shows_the_users_actions(env, ui_home):
    from app.settings.actions import Action
    from app.settings.store import SettingsStore

    store = SettingsStore()
    with store.edit() as settings:
        settings.actions = [Action(id="formal", name="Make formal", prompt="Formal: {text}", hotkey="Ctrl+Alt+F")]
        settings.preferences.hotkeys = {"summarize": "Ctrl+Alt+1"}
    done = qwen_tray(env, "action", "--list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "summarize  Summarize / 总结  [Ctrl+Alt+1]"  # the user's own hotkey for it
    assert lines[-1] == "formal     Make formal  [Ctrl+Alt+F]"
    assert "explain    Explain / 解释" in lines  # no hotkey


def test_tray_model_takes_a_registered_name_or_a_relative_folder_and_refuses_what_is_neither(tmp_path, monkeypatch):
    """`qwen-tray tray --model X` hands the running tray something it can find from its own folder."""
    from app.commands.tray import _model_to_hand_over

    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    assert _model_to_hand_over("folder") == str(tmp_path / "folder")
    with pytest.raises(QwenTrayError, match="model folder not found, and no registered model has that name"):
        _model_to_hand_over("no-such-model")
    with SettingsStore().edit() as settings:
        settings.add_model(ModelEntry("Mine", path=str(tmp_path / "folder")))
    assert _model_to_hand_over("Mine") == "Mine"  # the tray finds it in the registry
