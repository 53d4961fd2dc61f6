"""Settings → System (start at login from the state on disk, history, proxy, keys, log) and the
tray menu's History / Open log folder."""

from __future__ import annotations

import configparser
import os
import plistlib
import sys
from pathlib import Path

import keyring
import keyring.backend
import pytest
from PySide6.QtCore import QObject, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QGuiApplication
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

from app.paths import log_file
from app.settings.preferences import Preferences
from app.settings.store import SettingsStore
from app.ui.app import TrayApp
from app.ui.autostart import LaunchAgentAutostart, XdgAutostart, desktop_entry, launch_command
from app.ui.i18n import set_language
from app.ui.widgets.system_page import SystemPage


@pytest.fixture
def tray(qtbot):
    clipboard = QGuiApplication.clipboard()
    app = TrayApp(opener=FakeOpener(), hotkey_factory=FakeHotkeys, injector=RecordingInjector(clipboard, "words"))
    yield app
    app.shutdown()


def _entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str
    parser.read(path, encoding="utf-8")
    return parser["Desktop Entry"]


def test_start_at_login_writes_the_xdg_entry_and_shows_what_is_on_disk(qtbot, tray, tmp_path):
    autostart_file = Path(os.environ["XDG_CONFIG_HOME"]) / "autostart" / "qwen-tray.desktop"
    tray.open_settings()
    page = tray.settings_dialog.system_page
    assert not page.start_at_login.isChecked() and page.start_at_login.toolTip() == str(autostart_file)
    page.start_at_login.setChecked(True)
    assert tray.settings_dialog.apply()
    entry = _entry(autostart_file)
    assert entry["Exec"] == " ".join(f'"{a}"' for a in launch_command())
    assert entry["X-GNOME-Autostart-enabled"] == "true" and entry["Type"] == "Application"
    tray.settings_dialog.close()

    # The desktop's own startup settings turned it off: the next Settings shows it off.
    autostart_file.write_text(autostart_file.read_text(encoding="utf-8").replace(
        "X-GNOME-Autostart-enabled=true", "X-GNOME-Autostart-enabled=false"), encoding="utf-8")
    tray.open_settings()
    page = tray.settings_dialog.system_page
    assert not page.start_at_login.isChecked()
    page.start_at_login.setChecked(True)
    assert tray.settings_dialog.apply()
    assert _entry(autostart_file)["X-GNOME-Autostart-enabled"] == "true"
    page.start_at_login.setChecked(False)
    assert tray.settings_dialog.apply()
    assert not autostart_file.exists()


def test_an_unwritable_autostart_folder_is_said_in_the_dialog(qtbot, tray):
    blocker = Path(os.environ["XDG_CONFIG_HOME"]) / "autostart"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the folder should be", encoding="utf-8")
    tray.open_settings()
    dialog = tray.settings_dialog
    dialog.system_page.start_at_login.setChecked(True)
    assert not dialog.apply()
    assert dialog.error.text().startswith(f"cannot write {blocker / 'qwen-tray.desktop'}: ")
    assert not dialog.system_page.autostart.enabled()


def test_the_entry_is_the_installers_line_for_line():
    """installer/install.sh writes the same file (tests/ui/test_ui_installer.py compares them)."""
    text = desktop_entry(["/home/u/.local/share/qwen-tray/venv/bin/qwen-tray"], "/icons/qwen-tray.png")
    assert text.splitlines()[6] == 'Exec="/home/u/.local/share/qwen-tray/venv/bin/qwen-tray"'
    assert text.endswith("StartupNotify=false\nX-GNOME-Autostart-enabled=true\n")
    quoted = desktop_entry(["/opt/my $dir/python", "-m", "app.cli"], "/i.png").splitlines()[6]
    assert quoted == 'Exec="/opt/my \\$dir/python" "-m" "app.cli"'


def test_a_macos_launch_agent(tmp_path):
    agent = LaunchAgentAutostart(home=tmp_path)
    assert not agent.enabled()
    agent.enable(["/Applications/Qwen Tray/bin/qwen-tray"])
    plist = plistlib.loads(agent.path.read_bytes())
    assert plist == {"Label": "io.github.qwen-tray", "ProgramArguments": ["/Applications/Qwen Tray/bin/qwen-tray"],
                     "RunAtLoad": True, "ProcessType": "Interactive"}
    assert agent.enabled()
    agent.path.write_bytes(plistlib.dumps({**plist, "Disabled": True}))
    assert not agent.enabled()
    agent.disable()
    assert not agent.path.exists() and not agent.enabled()


class FakeKeychain(keyring.backend.KeyringBackend):
    """What keyring uses on macOS, as far as naming it goes."""

    priority = 1
    get_password = set_password = delete_password = None


FakeKeychain.__module__ = "keyring.backends.macOS"


def test_the_system_page_says_where_keys_are_kept_in_words(qtbot, tray, test_keyring, monkeypatch):
    set_language("zh_CN")
    tray.open_settings()
    page = tray.settings_dialog.system_page
    assert page.keys.text() == f"API 密钥以明文保存在文件 {test_keyring.file_path} 中（keyrings.alt；并非系统密钥环）"
    keyring.set_keyring(FakeKeychain())  # (the test_keyring fixture puts its own back)
    page = SystemPage(Preferences())
    qtbot.addWidget(page)
    assert page.keys.text() == "API 密钥保存在系统密钥环中（macOS Keychain）"


def test_history_and_proxy_are_saved_and_a_bad_proxy_named(qtbot, tray, test_keyring):
    tray.open_settings()
    dialog = tray.settings_dialog
    page = dialog.system_page
    assert page.keep_history.isChecked() and page.proxy.text() == ""
    assert page.keys.text() == (f"API keys are kept as plain text in the file {test_keyring.file_path} "
                                "(keyrings.alt; not a system keyring)")
    assert page.log.text() == str(log_file())
    page.proxy.setText("proxy.example:3128")
    assert not dialog.apply()
    assert dialog.error.text().startswith("preferences field 'network_proxy': must be empty (the system's proxy), "
                                          "'direct' or a proxy URL such as http://proxy.example:3128")
    page.proxy.setText("http://proxy.example:3128")
    page.keep_history.setChecked(False)
    assert dialog.apply()
    preferences = SettingsStore().load().preferences
    assert (preferences.network_proxy, preferences.keep_history) == ("http://proxy.example:3128", False)


class _UrlCatcher(QObject):
    def __init__(self):
        super().__init__()
        self.urls: list[QUrl] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:  # noqa: A003 (Qt's handler method name)
        self.urls.append(url)


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS opens file URLs itself, without the handler")
def test_the_tray_menu_opens_the_log_folder_and_the_history(qtbot, tray):
    catcher = _UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "open")
    try:
        tray.tray.menu.aboutToShow.emit()
        items = {a.text(): a for a in tray.tray.menu.actions() if not a.isSeparator()}
        items["Open log folder"].trigger()
        assert [u.toLocalFile() for u in catcher.urls] == [str(log_file().parent)]
        items["History…"].trigger()
        assert tray.history.window.isVisible()
    finally:
        QDesktopServices.unsetUrlHandler("file")
