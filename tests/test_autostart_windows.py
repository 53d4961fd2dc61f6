"""Windows autostart (app/ui/autostart.py) against a fake ``winreg`` holding what Settings, the
installer and Task Manager write: the HKCU Run value, install.ps1 -Autostart's Startup-folder
shortcut, and Task Manager's switch for each (StartupApproved\\Run, \\StartupFolder: a binary
value whose first byte is even when on, odd when off)."""

from __future__ import annotations

import types

import pytest

from app.ui.autostart import (APPROVED_FOLDER_KEY, APPROVED_RUN_KEY, RUN_KEY, RUN_VALUE, SHORTCUT_NAME,
                              AutostartError, WindowsAutostart)

ON, OFF = b"\x02" + bytes(11), b"\x03" + bytes(11)  # Task Manager's marks: flag byte + FILETIME
OFF_07 = b"\x07" + bytes(11)  # "disabled" as some Windows versions write it
COMMAND = [r"C:\Users\张三\AppData\Local\QwenTray\venv\Scripts\pythonw.exe", "-m", "app.cli"]


class FakeRegistry:
    """HKEY_CURRENT_USER as a dict of key path -> {value name: data}, with winreg's calls."""

    HKEY_CURRENT_USER, KEY_SET_VALUE, REG_SZ = 1, 2, 1

    def __init__(self):
        self.keys: dict[str, dict[str, object]] = {}
        self.read_only = False

    def as_module(self) -> types.SimpleNamespace:
        names = ("HKEY_CURRENT_USER", "KEY_SET_VALUE", "REG_SZ", "OpenKey", "CreateKey", "QueryValueEx",
                 "SetValueEx", "DeleteValue")
        return types.SimpleNamespace(**{name: getattr(self, name) for name in names})

    class Key:
        def __init__(self, path):
            self.path = path

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def OpenKey(self, root, path, *args):
        if path not in self.keys:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        return self.Key(path)

    def CreateKey(self, root, path):
        if self.read_only:
            raise PermissionError(5, "Access is denied")
        self.keys.setdefault(path, {})
        return self.Key(path)

    def QueryValueEx(self, key, name):
        if name not in self.keys[key.path]:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        return self.keys[key.path][name], 3

    def SetValueEx(self, key, name, reserved, kind, data):
        self.keys[key.path][name] = data

    def DeleteValue(self, key, name):
        if name not in self.keys[key.path]:
            raise FileNotFoundError(2, "The system cannot find the file specified")
        del self.keys[key.path][name]


@pytest.fixture
def registry():
    return FakeRegistry()


@pytest.fixture
def autostart(registry, tmp_path):
    return WindowsAutostart(registry.as_module(), startup_folder=tmp_path)


def _put_shortcut(autostart):
    autostart.shortcut.write_bytes(b"L\0\0\0")  # install.ps1 -Autostart's


def test_nothing_is_off(autostart):
    assert not autostart.enabled()


@pytest.mark.parametrize("mark, on", [(None, True), (ON, True), (b"\x06" + bytes(11), True), (OFF, False),
                                      (OFF_07, False), (b"", True)])
def test_the_installers_shortcut_counts_unless_task_manager_disabled_it(autostart, registry, mark, on):
    _put_shortcut(autostart)
    if mark is not None:
        registry.keys[APPROVED_FOLDER_KEY] = {SHORTCUT_NAME: mark}
    assert autostart.enabled() is on


@pytest.mark.parametrize("mark, on", [(None, True), (ON, True), (OFF, False), (OFF_07, False)])
def test_the_run_value_counts_unless_task_manager_disabled_it(autostart, registry, mark, on):
    registry.keys[RUN_KEY] = {RUN_VALUE: '"C:\\x\\pythonw.exe" "-m" "app.cli"'}
    if mark is not None:
        registry.keys[APPROVED_RUN_KEY] = {RUN_VALUE: mark}
    assert autostart.enabled() is on


def test_a_disabled_run_value_does_not_hide_an_enabled_shortcut(autostart, registry):
    registry.keys[RUN_KEY] = {RUN_VALUE: "x"}
    registry.keys[APPROVED_RUN_KEY] = {RUN_VALUE: OFF}
    _put_shortcut(autostart)
    assert autostart.enabled()


def test_turning_it_on_clears_task_managers_marks_and_leaves_one_entry(autostart, registry):
    _put_shortcut(autostart)
    registry.keys[APPROVED_FOLDER_KEY] = {SHORTCUT_NAME: OFF, "Other.lnk": OFF}
    registry.keys[APPROVED_RUN_KEY] = {RUN_VALUE: OFF_07, "Other": OFF}
    assert not autostart.enabled()  # what Settings shows: off, as Task Manager says
    autostart.enable(COMMAND)
    assert autostart.enabled()
    assert registry.keys[RUN_KEY][RUN_VALUE] == " ".join(f'"{a}"' for a in COMMAND)
    assert registry.keys[APPROVED_RUN_KEY] == {"Other": OFF}  # other programs' switches untouched
    assert registry.keys[APPROVED_FOLDER_KEY] == {"Other.lnk": OFF}
    assert not autostart.shortcut.exists()  # a second entry would start a second tray at sign-in


def test_turning_it_off_removes_every_entry_and_mark(autostart, registry):
    registry.keys[RUN_KEY] = {RUN_VALUE: "x", "Other": "y"}
    registry.keys[APPROVED_RUN_KEY] = {RUN_VALUE: ON}
    registry.keys[APPROVED_FOLDER_KEY] = {SHORTCUT_NAME: ON}
    _put_shortcut(autostart)
    autostart.disable()
    assert not autostart.enabled()
    assert registry.keys[RUN_KEY] == {"Other": "y"} and not autostart.shortcut.exists()
    assert registry.keys[APPROVED_RUN_KEY] == {} and registry.keys[APPROVED_FOLDER_KEY] == {}
    autostart.disable()  # nothing left: still fine


def test_a_run_key_that_cannot_be_written_is_said(autostart, registry):
    registry.read_only = True
    with pytest.raises(AutostartError, match=r"cannot write HKEY_CURRENT_USER\\.*\\Run\\Qwen Tray: Access is denied"):
        autostart.enable(COMMAND)
