"""Start Qwen Tray at login, the way each desktop expects; the state is always read from disk.

- Linux (XDG autostart, honoured by GNOME, KDE, Xfce...): ``~/.config/autostart/qwen-tray.desktop``,
  the same file ``installer/install.sh --autostart`` writes. A file with ``Hidden=true`` or
  ``X-GNOME-Autostart-enabled=false`` (a desktop's own startup settings) counts as off.
- macOS: a LaunchAgent, ``~/Library/LaunchAgents/io.github.qwen-tray.plist`` (RunAtLoad).
- Windows: the ``Qwen Tray`` value of the HKCU Run key; ``install.ps1 -Autostart``'s shortcut in
  the Startup folder counts too (and is removed when it is turned off or on: one entry, since a
  second start would open the running tray's chat window at sign-in). Task Manager's "Disabled"
  of either entry (StartupApproved) counts as off, and turning it on clears that mark.

No flag is stored: the installer, the desktop's settings or the user may change it meanwhile.
"""

from __future__ import annotations

import configparser
import os
import plistlib
import sys
from pathlib import Path

from app.errors import QwenTrayError
from app.paths import atomic_write_text, resources_dir

DESKTOP_FILE = "qwen-tray.desktop"
AGENT_LABEL = "io.github.qwen-tray"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
# Task Manager's Startup tab keeps its on/off switch apart from the entries, one key per kind of
# entry, a binary value named as the entry: a Run value by its name, a shortcut by its file name.
APPROVED_RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\Run"
APPROVED_FOLDER_KEY = r"Software\Microsoft\Windows\CurrentVersion\Explorer\StartupApproved\StartupFolder"
RUN_VALUE = "Qwen Tray"
SHORTCUT_NAME = "Qwen Tray.lnk"  # install.ps1 -Autostart's, in the Startup folder


class AutostartError(QwenTrayError):
    """Autostart could not be changed (names the file or key, and why)."""


def launch_command() -> list[str]:
    """How this installation starts its tray: the qwen-tray script beside the interpreter (an
    installer's venv), else ``python -m app.cli`` (pythonw on Windows: no console window)."""
    scripts = Path(sys.executable).parent
    if sys.platform == "win32":
        pythonw = scripts / "pythonw.exe"
        return [str(pythonw if pythonw.is_file() else Path(sys.executable)), "-m", "app.cli"]
    script = scripts / "qwen-tray"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "app.cli"]


def _desktop_quote(arg: str) -> str:
    """An Exec argument as the desktop entry spec quotes it (always quoted: install.sh does too)."""
    escaped = "".join("\\" + c if c in '"`$\\' else c for c in arg)
    return f'"{escaped}"'


def desktop_entry(command: list[str], icon: str) -> str:
    """The autostart entry, line for line as installer/install.sh writes it."""
    return "\n".join([
        "[Desktop Entry]", "Type=Application", "Name=Qwen Tray", "Name[zh_CN]=Qwen Tray",
        "Comment=Local assistant: summarize, translate and rewrite selected text with a hotkey",
        "Comment[zh_CN]=本地助手：用快捷键总结、翻译、改写所选文字",
        "Exec=" + " ".join(_desktop_quote(a) for a in command), f"Icon={icon}", "Terminal=false",
        "Categories=Utility;TextTools;", "StartupNotify=false", "X-GNOME-Autostart-enabled=true", ""])


def _write(path: Path, text: str) -> None:
    try:
        atomic_write_text(path, text)
    except OSError as e:
        raise AutostartError(f"cannot write {path}: {e.strerror or e}") from None


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise AutostartError(f"cannot remove {path}: {e.strerror or e}") from None


class XdgAutostart:
    def __init__(self, config_home: Path | None = None, data_home: Path | None = None):
        home = Path.home()
        self.path = (config_home or Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")) / "autostart" \
            / DESKTOP_FILE
        data = data_home or Path(os.environ.get("XDG_DATA_HOME") or home / ".local/share")
        self._installed_icon = data / "icons/hicolor/256x256/apps/qwen-tray.png"  # install.sh puts it there

    def where(self) -> str:
        return str(self.path)

    def enabled(self) -> bool:
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # keys are case-sensitive in .desktop files
        try:
            if not parser.read(self.path, encoding="utf-8") or "Desktop Entry" not in parser:
                return False
        except (configparser.Error, UnicodeDecodeError, OSError):
            return False  # a desktop ignores an entry it cannot read
        entry = parser["Desktop Entry"]
        return entry.get("Hidden", "false") != "true" and entry.get("X-GNOME-Autostart-enabled", "true") != "false"

    def enable(self, command: list[str]) -> None:
        icon = self._installed_icon if self._installed_icon.is_file() else resources_dir() / "icons" / "qwen-tray.png"
        _write(self.path, desktop_entry(command, str(icon)))

    def disable(self) -> None:
        _remove(self.path)


class LaunchAgentAutostart:
    def __init__(self, home: Path | None = None):
        self.path = (home or Path.home()) / "Library" / "LaunchAgents" / f"{AGENT_LABEL}.plist"

    def where(self) -> str:
        return str(self.path)

    def enabled(self) -> bool:
        try:
            agent = plistlib.loads(self.path.read_bytes())
        except (OSError, plistlib.InvalidFileException, ValueError):
            return False
        return isinstance(agent, dict) and agent.get("RunAtLoad") is True and agent.get("Disabled") is not True

    def enable(self, command: list[str]) -> None:
        agent = {"Label": AGENT_LABEL, "ProgramArguments": command, "RunAtLoad": True, "ProcessType": "Interactive"}
        _write(self.path, plistlib.dumps(agent).decode("utf-8"))

    def disable(self) -> None:
        _remove(self.path)


class WindowsAutostart:
    """The HKCU Run key (install.ps1's Startup-folder shortcut counts too). ``winreg`` is passed in
    by tests (a fake: tests/test_autostart_windows.py); on Windows it is the real one."""

    def __init__(self, winreg=None, startup_folder: Path | None = None):
        if winreg is None:
            import winreg  # (Windows only)

        self._winreg = winreg
        startup = startup_folder or Path(os.environ.get("APPDATA", "")) / "Microsoft/Windows/Start Menu/Programs/Startup"
        self.shortcut = startup / SHORTCUT_NAME

    def where(self) -> str:
        return f"HKEY_CURRENT_USER\\{RUN_KEY}\\{RUN_VALUE}"

    def _value(self, key_path: str, name: str) -> object | None:
        try:
            with self._winreg.OpenKey(self._winreg.HKEY_CURRENT_USER, key_path) as key:
                return self._winreg.QueryValueEx(key, name)[0]
        except OSError:
            return None

    def _approved(self, key_path: str, name: str) -> bool:
        """Whether Task Manager leaves the entry on: no mark, or a first byte that is even. Not
        documented by Microsoft; startup managers agree on 02 and 06 (08) on, 03 and 07 (01, 09) off."""
        mark = self._value(key_path, name)
        if not isinstance(mark, bytes) or not mark:
            return True  # never switched in Task Manager
        return mark[0] % 2 == 0

    def enabled(self) -> bool:
        run = self._value(RUN_KEY, RUN_VALUE) is not None and self._approved(APPROVED_RUN_KEY, RUN_VALUE)
        shortcut = self.shortcut.is_file() and self._approved(APPROVED_FOLDER_KEY, SHORTCUT_NAME)
        return run or shortcut

    def enable(self, command: list[str]) -> None:
        winreg = self._winreg
        try:
            with winreg.CreateKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.SetValueEx(key, RUN_VALUE, 0, winreg.REG_SZ, " ".join(f'"{a}"' for a in command))
            # switched off in Task Manager before: without the mark it is on again
            self._delete(APPROVED_RUN_KEY, RUN_VALUE)
            # the Run value is the one entry now: the shortcut (and its mark) would start a second tray
            self.shortcut.unlink(missing_ok=True)
            self._delete(APPROVED_FOLDER_KEY, SHORTCUT_NAME)
        except OSError as e:
            raise AutostartError(f"cannot write {self.where()}: {e.strerror or e}") from None

    def disable(self) -> None:
        try:
            self._delete(RUN_KEY, RUN_VALUE)
            self._delete(APPROVED_RUN_KEY, RUN_VALUE)
            self.shortcut.unlink(missing_ok=True)
            self._delete(APPROVED_FOLDER_KEY, SHORTCUT_NAME)
        except OSError as e:
            raise AutostartError(f"cannot remove {self.where()}: {e.strerror or e}") from None

    def _delete(self, key_path: str, name: str) -> None:
        try:
            with self._winreg.OpenKey(self._winreg.HKEY_CURRENT_USER, key_path, 0, self._winreg.KEY_SET_VALUE) as key:
                self._winreg.DeleteValue(key, name)
        except FileNotFoundError:
            pass


Autostart = XdgAutostart | LaunchAgentAutostart | WindowsAutostart


def autostart_for_platform() -> Autostart:
    if sys.platform == "win32":
        return WindowsAutostart()
    if sys.platform == "darwin":
        return LaunchAgentAutostart()
    return XdgAutostart()


def set_autostart(autostart: Autostart, on: bool) -> None:
    """Turn it on (with this installation's command) or off; AutostartError says why it could not."""
    if on:
        autostart.enable(launch_command())
    else:
        autostart.disable()
