"""End to end under a real X server (Xvfb): a real global hotkey pressed as a person does,
real copy/paste keys through XTest, the real clipboard shared between processes, the real engine.

The user's editor (ui_x11_target.py) holds selected text while other text (or an image) is
on the clipboard. xdotool holds Ctrl+Alt+letter down for 150-300 ms, releases the letter,
then the modifiers, like a person; the tray app (ui_x11_driver.py) must copy the selection
(not act on the clipboard), run the action with a tiny random Qwen2 model and show the popup;
Esc closes it and gives the keyboard back to the editor. `qwen-tray action NAME` (what a
desktop's own shortcut runs) copies the selection the same way with no hotkey held. Replace pastes the answer over the
selection and the user's clipboard comes back in every format. A window with a terminal's
WM_CLASS gets Ctrl+Shift+C and never Ctrl+C; one that copies nothing (xterm) is read from
the PRIMARY selection and the popup says so. Skipped where Xvfb/xdotool/xclip are missing.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys

import pytest
from ui_children import TIMEOUT, Child
from ui_x11_display import REPO, press_like_a_person, run_x, tray_env

pytestmark = [pytest.mark.x11, pytest.mark.slow]


@pytest.fixture(scope="module")
def session(xdisplay, tmp_path_factory, tiny_qwen_dir):
    """The tray app (real hotkeys, keys, clipboard, engine) and the environment targets run in."""
    home = tmp_path_factory.mktemp("x11-home")
    (home / "config").mkdir(parents=True)
    # Short answers: the tests are about the text going in, not about what comes out.
    (home / "config" / "ui-preferences.json").write_text(json.dumps({"max_tokens": 16, "temperature": 0}))
    env = tray_env(xdisplay, home)
    driver = Child(["ui_x11_driver.py", "--model", str(tiny_qwen_dir)], env)
    try:
        ready = driver.wait_for("ready")
        assert ready["hotkeys"]["summarize"] == "Ctrl+Alt+S" and ready["failures"] == {}
        yield driver, env
    finally:
        driver.stop()


@pytest.fixture
def start_target(session, xdisplay):
    """start_target(*args) -> (the target process, its window id), focused like the user's window."""
    driver, env = session
    targets = []

    def start(*args: str):
        target = Child(["ui_x11_target.py", *args], env)
        targets.append(target)
        wid = target.wait_for("ready")["wid"]
        run_x(xdisplay, "xdotool", "windowfocus", "--sync", str(wid))
        driver.drain()
        return target, wid

    yield start
    for target in targets:
        target.stop()


def _close_popup_with_escape(display: str, driver: Child, wid: int) -> None:
    run_x(display, "xdotool", "key", "Escape")
    driver.wait_for("popup_closed")
    assert int(run_x(display, "xdotool", "getwindowfocus").strip()) == wid  # the keyboard is back


def test_a_hotkey_pressed_while_the_model_loads_answers_on_what_was_selected_then(xdisplay, tmp_path, tiny_qwen_dir):
    """Right after login the model is still loading: the press copies the selection now, and the
    answer is about it, although the user selected something else before the load ended.
    (First in this file: it runs its own tray before the module's session grabs the hotkeys.)"""
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "ui-preferences.json").write_text(json.dumps({"max_tokens": 8, "temperature": 0}))
    env = tray_env(xdisplay, home)
    driver = Child(["ui_x11_driver.py", "--model", str(tiny_qwen_dir), "--hold-load"], env)
    target = Child(["ui_x11_target.py"], env)
    try:
        driver.wait_for("loading")
        wid = target.wait_for("ready")["wid"]
        run_x(xdisplay, "xdotool", "windowfocus", "--sync", str(wid))
        first = "The budget review moved to room 204 on Thursday."
        target.command(f"select {first}")
        target.command("clip-text stale clipboard text")
        press_like_a_person(xdisplay, "s", 0.2)
        captured = driver.wait_for("captured")
        assert (captured["origin"], captured["text"]) == ("selection", first)
        target.command("select Something selected while the model was still loading.")
        driver.send("release-load")
        answer = driver.wait_for("answer")
        assert answer["popup_visible"] and answer["replace_enabled"]
        assert answer["source"].startswith("Selected text: The budget review moved to room 204")
        assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == "stale clipboard text"
    finally:
        target.stop()
        driver.stop()


def test_human_presses_copy_the_selection_every_time_never_the_clipboard(xdisplay, session, start_target):
    driver, _env = session
    target, wid = start_target()
    letters = "stdr" * 3  # summarize, translate, to-dos, rewrite: 12 presses in a row
    holds = (0.15, 0.2, 0.3, 0.25)
    misses = []
    for i, letter in enumerate(letters):
        selection = f"Selection {i}: the budget review moved to room {100 + i} on Thursday."
        target.command(f"select {selection}")
        image = i % 3 == 2
        target.command("clip-image" if image else f"clip-text stale clipboard text {i}")
        press_like_a_person(xdisplay, letter, holds[i % len(holds)])
        captured = driver.wait_for("captured")
        if (captured["origin"], captured["text"]) != ("selection", selection):
            misses.append((i, letter, captured))
        answer = driver.wait_for("answer")
        assert answer["popup_visible"] and answer["replace_enabled"] == (captured["origin"] == "selection")
        _close_popup_with_escape(xdisplay, driver, wid)
        if image:
            assert "image/png" in run_x(xdisplay, "xclip", "-o", "-selection", "clipboard", "-t", "TARGETS")
        else:
            assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == f"stale clipboard text {i}"
    assert misses == []


def test_hotkey_summarize_replace_and_clipboard_restored(xdisplay, session, start_target):
    driver, _env = session
    target, _wid = start_target()
    press_like_a_person(xdisplay, "s", 0.2)
    assert driver.wait_for("captured")["origin"] == "selection"
    answer = driver.wait_for("answer")
    assert answer["popup_visible"] and answer["text"].strip()
    assert answer["popup_text"] == answer["text"]
    assert "tokens/s" in answer["status"]
    assert answer["source"].startswith("Selected text: The quarterly planning meeting")

    x, y = answer["replace"]
    run_x(xdisplay, "xdotool", "mousemove", str(x), str(y), "click", "1")
    driver.wait_for("pasted")
    target.send("text")
    field = target.wait_for("text")["text"]
    assert field == answer["text"].replace("\r\n", "\n").replace("\r", "\n")  # the selection was replaced

    from ui_x11_target import CLIPBOARD_HTML, CLIPBOARD_TEXT

    assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == CLIPBOARD_TEXT
    assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard", "-t", "text/html") == CLIPBOARD_HTML


def test_a_terminal_gets_ctrl_shift_c_and_never_ctrl_c(xdisplay, session, start_target):
    driver, _env = session
    target, wid = start_target("--wm-class", "gnome-terminal-server,Gnome-terminal", "--copy-keys", "ctrl+shift+c")
    selection = "ls: cannot access 'report.pdf': No such file or directory"
    target.command(f"select {selection}")
    target.command("clip-text stale clipboard text")
    press_like_a_person(xdisplay, "s", 0.2)
    captured = driver.wait_for("captured")
    assert (captured["origin"], captured["text"]) == ("selection", selection)
    answer = driver.wait_for("answer")
    assert not answer["replace_enabled"]  # a terminal's output is not replaced (nor typed at its prompt)
    _close_popup_with_escape(xdisplay, driver, wid)
    assert [e for e in target.seen if e["event"] == "ctrl_c"] == []


def test_a_window_that_copies_nothing_is_read_from_primary_and_said_so(xdisplay, session, start_target):
    """xterm has no copy keys: what is selected is in the PRIMARY selection."""
    driver, _env = session
    target, wid = start_target("--wm-class", "xterm,XTerm", "--copy-keys", "none")
    selection = "make: *** [Makefile:12: all] Error 2"
    target.command(f"select {selection}")
    target.command("clip-text stale clipboard text")
    press_like_a_person(xdisplay, "s", 0.2)
    captured = driver.wait_for("captured")
    assert (captured["origin"], captured["text"]) == ("primary", selection)
    answer = driver.wait_for("answer")
    assert answer["source"] == f"From the primary selection (Ctrl+Shift+C copied nothing): {selection}"
    assert not answer["replace_enabled"]
    _close_popup_with_escape(xdisplay, driver, wid)
    assert [e for e in target.seen if e["event"] == "ctrl_c"] == []
    assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == "stale clipboard text"


def _qwen_tray_action(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "action", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=TIMEOUT)


def test_qwen_tray_action_copies_the_selection_with_no_hotkey_held(xdisplay, session, start_target):
    """What a desktop's own shortcut runs (Wayland, a launcher): a command, no hotkey of ours."""
    driver, env = session
    target, wid = start_target()
    selection = "Action from a shortcut: the design review moved to room 204 on Monday."
    target.command(f"select {selection}")
    target.command("clip-text stale clipboard text")
    done = _qwen_tray_action(env, "summarize")
    assert (done.returncode, done.stdout) == (0, "Summarize runs on the selection; the answer shows in its popup\n")
    captured = driver.wait_for("captured")
    assert (captured["origin"], captured["text"]) == ("selection", selection)
    answer = driver.wait_for("answer")
    assert answer["popup_visible"] and answer["replace_enabled"]
    assert answer["source"].startswith("Selected text: Action from a shortcut:")
    _close_popup_with_escape(xdisplay, driver, wid)
    assert run_x(xdisplay, "xclip", "-o", "-selection", "clipboard") == "stale clipboard text"


def test_qwen_tray_action_copies_while_the_shortcut_keys_are_still_down(xdisplay, session, start_target):
    """A desktop shortcut starts the command while its keys are still down; the editor takes
    Super+Ctrl+C for something else, so the copy must reach it as plain Ctrl+C."""
    driver, env = session
    target, _wid = start_target()
    selection = "Held shortcut: invoices are due on the 30th."
    target.command(f"select {selection}")
    target.command("clip-text stale clipboard text")
    # Super+F9 (F9: a key the editor does not type, as a desktop's grab would keep it from it).
    run_x(xdisplay, "xdotool", "keydown", "super", "keydown", "F9")
    command = subprocess.Popen([sys.executable, "-m", "app.cli", "action", "rewrite"], env=env, cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert command.wait(TIMEOUT) == 0, command.stderr.read()
    finally:
        # Released like a person: the key after 250 ms, then the modifier.
        run_x(xdisplay, "xdotool", "sleep", "0.25", "keyup", "F9", "sleep", "0.06", "keyup", "super")
    captured = driver.wait_for("captured")
    assert (captured["origin"], captured["text"]) == ("selection", selection)
    driver.wait_for("answer")


def test_the_tray_finds_the_display_usable(xdisplay):
    from app.commands.display import display_problem

    env = {k: v for k, v in os.environ.items() if k not in ("WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    assert display_problem({**env, "DISPLAY": xdisplay}) is None


def test_x11_hotkey_conflict_is_reported(xdisplay, monkeypatch):
    monkeypatch.setenv("DISPLAY", xdisplay)
    from app.ui.platform.hotkeys_x11 import X11Hotkeys
    from app.settings.keys import HotkeyConflictError, parse_hotkey

    first, second = X11Hotkeys(lambda b: None), X11Hotkeys(lambda b: None)
    try:
        first.register("first", parse_hotkey("Ctrl+Alt+J"))
        with pytest.raises(HotkeyConflictError, match="already taken"):
            second.register("mine", parse_hotkey("Ctrl+Alt+J"))
        second.register("other", parse_hotkey("Ctrl+Alt+K"))  # the refused grab left nothing half-registered
        first.unregister_all()
        second.register("mine", parse_hotkey("Ctrl+Alt+J"))  # free again once released
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
        hotkeys.register("translate", parse_hotkey("Ctrl+Alt+L"))
        run_x(xdisplay, "xdotool", "key", "ctrl+alt+l", "ctrl+alt+l")
        # Held long enough for X auto-repeat (a stream of release+press pairs): still one activation.
        run_x(xdisplay, "xdotool", "keydown", "ctrl+alt+l", "sleep", "1.5", "keyup", "ctrl+alt+l")
        assert [fired.get(timeout=TIMEOUT) for _ in range(3)] == ["translate"] * 3
        run_x(xdisplay, "xdotool", "key", "ctrl+alt+x")  # not registered: nothing fires
        hotkeys.register("sentinel", parse_hotkey("Ctrl+Alt+Y"))
        run_x(xdisplay, "xdotool", "key", "ctrl+alt+y")
        assert fired.get(timeout=TIMEOUT) == "sentinel"  # nothing came between the third press and this one
    finally:
        hotkeys.close()


def test_the_key_injector_closed_at_quit_ignores_a_late_focus_restore(xdisplay, monkeypatch):
    """Quitting with the popup open: the popup's close asks to give the focus back after the app
    closed its X connection; that is a no-op, not an Xlib traceback."""
    monkeypatch.setenv("DISPLAY", xdisplay)
    from app.ui.platform.keyinput_x11 import X11KeyInjector

    injector = X11KeyInjector()
    focus = injector.remember_focus()
    injector.restore_focus(focus)  # open: works
    injector.close()
    injector.restore_focus(focus)
    injector.close()  # twice: no error either
