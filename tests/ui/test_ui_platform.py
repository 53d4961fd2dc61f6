"""Per-platform key tables and structures that can be checked on any OS, the hotkey manager,
the state icons, and the clipboard keeper's payload. (Real X11 grabs and XTest are in
test_ui_x11_e2e.py, the clipboard keeper on a real X server in test_ui_x11_clipboard_keeper.py.)"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
from PySide6.QtGui import QColor, QGuiApplication

from app.ui.platform import hotkeys_mac, hotkeys_win, hotkeys_x11, keyinput_win, shortcuts
from app.ui.platform.clipboard import ClipboardSnapshot
from app.ui.platform.clipboard_keeper import MODULE, keep_clipboard_after_quit, keeper_payload, mime_from_payload
from app.ui.platform.hotkeys import HotkeyManager, UnavailableHotkeys, create_hotkey_backend
from app.settings.keys import NAMED_KEYS, parse_hotkey

ALL_KEYS = sorted(set(NAMED_KEYS.values()))


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_has_a_code_on_every_platform(key):
    assert hotkeys_win.virtual_key_for(key) > 0
    assert hotkeys_x11.keysym_for(key) > 0
    assert hotkeys_mac.pynput_combo(parse_hotkey(f"Ctrl+Alt+{key}")).startswith("<ctrl>+<alt>+")


def test_windows_virtual_keys_and_modifiers():
    assert [hotkeys_win.virtual_key_for(k) for k in ("A", "Z", "0", "9", "F1", "F24", "Space", ",")] == \
        [0x41, 0x5A, 0x30, 0x39, 0x70, 0x87, 0x20, 0xBC]
    flags = hotkeys_win.modifier_flags(parse_hotkey("Ctrl+Alt+S"))
    assert flags == hotkeys_win.MOD_CONTROL | hotkeys_win.MOD_ALT | hotkeys_win.MOD_NOREPEAT


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="Windows x64 layout")
def test_sendinput_structures_have_the_windows_x64_layout():
    assert ctypes.sizeof(keyinput_win.INPUT) == 40  # SendInput rejects any other cbSize
    events = keyinput_win.key_events([(0x11, False), (0x43, False), (0x43, True), (0x11, True)])
    assert [(e.type, e.u.ki.wVk, e.u.ki.dwFlags) for e in events] == [
        (1, 0x11, 0), (1, 0x43, 0), (1, 0x43, keyinput_win.KEYEVENTF_KEYUP), (1, 0x11, keyinput_win.KEYEVENTF_KEYUP)]


def test_wm_hotkey_reaches_the_callback_through_the_native_event_filter(qapp):
    seen = []
    event_filter = hotkeys_win._HotkeyFilter(seen.append)
    msg = hotkeys_win.MSG(message=hotkeys_win.WM_HOTKEY, wParam=7)
    assert event_filter.nativeEventFilter(b"windows_generic_MSG", ctypes.addressof(msg)) == (True, 0)
    other = hotkeys_win.MSG(message=0x0100, wParam=7)  # WM_KEYDOWN: not ours
    assert event_filter.nativeEventFilter(b"windows_generic_MSG", ctypes.addressof(other)) == (False, 0)
    assert event_filter.nativeEventFilter(b"xcb_generic_event_t", ctypes.addressof(msg)) == (False, 0)
    assert seen == [7]


def test_pynput_spelling():
    assert hotkeys_mac.pynput_combo(parse_hotkey("Ctrl+Alt+S")) == "<ctrl>+<alt>+s"
    assert hotkeys_mac.pynput_combo(parse_hotkey("Super+Shift+F5")) == "<shift>+<cmd>+<f5>"
    assert hotkeys_mac.pynput_combo(parse_hotkey("Ctrl+Alt+Space")) == "<ctrl>+<alt>+<space>"


class _Recorder:
    name = "recorder"

    def __init__(self, on_activate):
        self.registered = {}

    def register(self, binding_id, hotkey):
        self.registered[binding_id] = str(hotkey)

    def unregister_all(self):
        self.registered.clear()

    def close(self):
        self.unregister_all()


def test_manager_refuses_the_same_hotkey_twice_and_bad_strings(qapp):
    manager = HotkeyManager(_Recorder)
    failures = manager.apply({"summarize": "Ctrl+Alt+S", "mine": "alt+ctrl+s", "bad": "Q", "off": ""})
    assert manager.active == {"summarize": "Ctrl+Alt+S"}
    assert "already used by 'summarize'" in failures["mine"]
    assert "needs Ctrl, Alt or Super" in failures["bad"]
    assert "off" not in failures


def test_without_a_display_hotkeys_are_reported_unavailable(qapp, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.setattr("sys.platform", "linux")
    backend = create_hotkey_backend(lambda b: None)
    assert isinstance(backend, UnavailableHotkeys) and "DISPLAY" in backend.reason
    manager = HotkeyManager(lambda cb: backend)
    assert "unavailable" in manager.apply({"summarize": "Ctrl+Alt+S"})["summarize"]


@pytest.mark.parametrize("state, colour", [("ready", "#22c55e"), ("busy", "#3b82f6"), ("loading", "#f59e0b"),
                                           ("error", "#ef4444")])
def test_state_icon_badge_colour(qapp, state, colour):
    from app.ui.widgets.icons import draw_icon

    image = draw_icon(state, 64).toImage()
    badge = image.pixelColor(64 - 13, 64 - 13)  # the badge's centre
    assert badge == QColor(colour)
    assert image.pixelColor(8, 32) == QColor("#4f46e5")  # the mark itself


# -- copy/paste keys per application -------------------------------------------------------------

@pytest.mark.parametrize("platform, app_ids, style", [
    ("linux", ("gnome-terminal-server", "gnome-terminal"), "ctrl_shift"),
    ("linux", ("Konsole", "konsole"), "ctrl_shift"),
    ("linux", ("xterm", "XTerm"), "ctrl_shift"),
    ("linux", ("kate", "kate"), "standard"),
    ("linux", (), "standard"),
    ("win32", ("cascadia_hosting_window_class", "windowsterminal.exe"), "ctrl_shift"),
    ("win32", ("ConsoleWindowClass", "cmd.exe"), "ctrl_insert"),
    ("win32", ("mintty", "mintty.exe"), "ctrl_insert"),
    ("win32", ("putty", "putty.exe"), "none"),
    ("win32", ("notepad", "notepad.exe"), "standard"),
    ("darwin", ("com.apple.terminal",), "standard"),
])
def test_terminals_are_recognised_by_window_class_and_program(platform, app_ids, style):
    assert shortcuts.style_for(app_ids, {}, platform) == style


def test_the_users_override_wins_whatever_the_case():
    assert shortcuts.style_for(("XTerm",), {"xterm": "none"}, "linux") == "none"
    assert shortcuts.style_for(("Code", "code"), {"code": "ctrl_shift"}, "linux") == "ctrl_shift"
    assert shortcuts.style_for(("kate",), {"code": "ctrl_shift"}, "linux") == "standard"


def test_ctrl_c_and_ctrl_z_never_go_into_a_terminal():
    for style in ("ctrl_shift", "ctrl_insert", "none"):
        assert str(shortcuts.chord_for("copy", style, "linux")) != "Ctrl+C"
        assert shortcuts.chord_for("undo", style, "linux") is None and shortcuts.is_terminal_style(style)
    assert [str(shortcuts.chord_for(a, "ctrl_shift", "linux")) for a in ("copy", "paste")] == \
        ["Ctrl+Shift+C", "Ctrl+Shift+V"]
    assert [str(shortcuts.chord_for(a, "ctrl_insert", "win32")) for a in ("copy", "paste")] == \
        ["Ctrl+Insert", "Shift+Insert"]
    assert [str(shortcuts.chord_for(a, "standard", "darwin")) for a in ("copy", "paste", "undo")] == \
        ["Super+C", "Super+V", "Super+Z"]  # ⌘
    assert not shortcuts.is_terminal_style("standard")


def test_windows_chords_mark_the_navigation_keys_extended():
    insert_copy = keyinput_win.chord_events(shortcuts.chord_for("copy", "ctrl_insert", "win32"))
    assert insert_copy == [(0x11, False), (0x2D, False), (0x2D, True), (0x11, True)]
    events = keyinput_win.key_events(insert_copy)
    assert [e.u.ki.dwFlags for e in events] == [0, keyinput_win.KEYEVENTF_EXTENDEDKEY,
                                                keyinput_win.KEYEVENTF_EXTENDEDKEY | keyinput_win.KEYEVENTF_KEYUP,
                                                keyinput_win.KEYEVENTF_KEYUP]
    paste = keyinput_win.chord_events(shortcuts.chord_for("paste", "ctrl_shift", "win32"))
    assert paste == [(0x11, False), (0x10, False), (0x56, False), (0x56, True), (0x10, True), (0x11, True)]


class _Library:
    """Stands in for a ctypes DLL: records each function's declared argument and result types."""

    def __init__(self):
        self.functions = {}

    def __getattr__(self, name):
        return self.functions.setdefault(name, type("Function", (), {})())


def test_every_windows_function_the_injector_calls_is_declared():
    user32, kernel32 = _Library(), _Library()
    keyinput_win._declare(user32, kernel32)
    used = {"GetForegroundWindow", "SetForegroundWindow", "SendInput", "GetAsyncKeyState",
            "GetClipboardSequenceNumber", "GetClassNameW", "GetWindowThreadProcessId"}
    assert set(user32.functions) == used
    assert set(kernel32.functions) == {"OpenProcess", "QueryFullProcessImageNameW", "CloseHandle"}
    for function in [*user32.functions.values(), *kernel32.functions.values()]:
        assert isinstance(function.argtypes, list) and function.restype is not None


# -- hotkeys captured by pressing them ----------------------------------------------------------

@pytest.mark.parametrize("platform, qt, ours", [
    ("linux", "Ctrl+Alt+S", "Ctrl+Alt+S"), ("linux", "Meta+Shift+PgUp", "Super+Shift+PageUp"),
    ("win32", "Ctrl+Alt+Ins", "Ctrl+Alt+Insert"), ("linux", "Ctrl+Alt+Return", "Ctrl+Alt+Enter"),
    ("darwin", "Ctrl+Shift+S", "Super+Shift+S"), ("darwin", "Meta+Alt+T", "Ctrl+Alt+T"),
])
def test_pressed_combinations_become_hotkeys_and_back(qapp, platform, qt, ours):
    from PySide6.QtGui import QKeySequence

    from app.ui.widgets.hotkeys_page import hotkey_text, key_sequence

    assert hotkey_text(QKeySequence(qt, QKeySequence.PortableText), platform) == ours
    assert key_sequence(ours, platform).toString(QKeySequence.PortableText) == \
        QKeySequence(qt, QKeySequence.PortableText).toString(QKeySequence.PortableText)
    assert hotkey_text(QKeySequence(), platform) == ""


def test_the_clipboard_keeper_gets_every_format_byte_for_byte():
    snapshot = ClipboardSnapshot((("text/plain", "naïve 文字".encode()), ("text/html", b"<b>x</b>"),
                                  ("image/png", bytes(range(256)))), "naïve 文字")
    owner, mime = mime_from_payload(keeper_payload(snapshot, 0x2A00005))
    assert owner == 0x2A00005
    assert {fmt: bytes(mime.data(fmt).data()) for fmt in mime.formats()} == dict(snapshot.formats)


def test_the_clipboard_keeper_refuses_a_malformed_payload_in_one_line():
    for payload in (b"", b"{}", b'{"owner": 1, "formats": [["text/plain", "not base64!"]]}'):
        with pytest.raises(ValueError, match="malformed payload"):
            mime_from_payload(payload)
    keeper = subprocess.run([sys.executable, "-m", MODULE], input=b"[1, 2]", capture_output=True, timeout=60)
    assert keeper.returncode == 2 and keeper.stdout.decode().startswith("malformed payload (")


def test_off_x11_the_clipboard_stays_with_the_system(qapp):
    """Windows, macOS and Wayland keep the clipboard themselves; offscreen there is none to keep."""
    clipboard = QGuiApplication.clipboard()
    clipboard.setText("the user's clipboard")
    assert QGuiApplication.platformName() != "xcb"
    assert keep_clipboard_after_quit(clipboard) is None
