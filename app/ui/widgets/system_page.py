"""Settings → System: start at login, keep history, the network proxy for remote models, where the
API keys and the log are."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QCheckBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QWidget

from app import secrets
from app.paths import log_file
from app.settings.preferences import Preferences
from app.ui.autostart import Autostart, autostart_for_platform, set_autostart
from app.ui.i18n import tr


def open_folder(folder: Path) -> bool:
    """Show ``folder`` in the desktop's file manager; False when nothing could open it."""
    folder.mkdir(parents=True, exist_ok=True)
    return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))


def key_storage_text() -> str:
    reason = secrets.unavailable_reason()
    if reason is not None:
        return tr("API keys stay in settings.json as plain text: {reason}", reason=reason)
    kind, where = secrets.key_store()
    if kind == "system":
        return tr("API keys are kept in the system keyring ({keyring})", keyring=where)
    if kind == "plain-text file":
        return tr("API keys are kept as plain text in the file {file} (keyrings.alt; not a system keyring)", file=where)
    if kind == "encrypted file":
        return tr("API keys are kept encrypted in the file {file} (keyrings.alt; not a system keyring)", file=where)
    return tr("API keys are kept by the keyring backend {keyring}", keyring=where)


class SystemPage(QWidget):
    def __init__(self, prefs: Preferences, autostart: Autostart | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.autostart = autostart or autostart_for_platform()
        self.start_at_login = QCheckBox(tr("Start Qwen Tray when I log in"))
        self.start_at_login.setToolTip(self.autostart.where())
        self.start_at_login.setChecked(self.autostart.enabled())
        self.keep_history = QCheckBox(tr("Keep chats and action results in the history"))
        self.keep_history.setChecked(prefs.keep_history)
        self.proxy = QLineEdit(prefs.network_proxy)
        self.proxy.setPlaceholderText(tr("Empty: the system's proxy; direct: none; or http://proxy:3128"))
        self.keys = QLabel(key_storage_text(), wordWrap=True)
        self.log = QLabel(str(log_file()), wordWrap=True)
        self.log.setTextInteractionFlags(Qt.TextSelectableByMouse)
        open_log = QPushButton(tr("Open log folder"))
        open_log.clicked.connect(lambda: open_folder(log_file().parent))
        log_row = QHBoxLayout()
        log_row.addWidget(self.log, 1)
        log_row.addWidget(open_log)
        form = QFormLayout(self)
        form.addRow(self.start_at_login)
        form.addRow(self.keep_history)
        form.addRow(tr("Network proxy for remote models"), self.proxy)
        form.addRow(tr("API keys"), self.keys)
        form.addRow(tr("Log file"), log_row)

    def values(self) -> dict:
        """The preferences this page edits."""
        return {"keep_history": self.keep_history.isChecked(), "network_proxy": self.proxy.text().strip()}

    def apply_autostart(self) -> None:
        """Turn autostart on or off where it differs from what is on disk (AutostartError says why not)."""
        wanted = self.start_at_login.isChecked()
        if wanted != self.autostart.enabled():
            set_autostart(self.autostart, wanted)
        self.start_at_login.setChecked(self.autostart.enabled())
