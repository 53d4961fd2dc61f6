"""Settings → Local API: its port, the API key clients must send (kept in the OS keyring, never in
settings.json; app/ui/controllers/local_api.py) and how to call it: the base URL to copy, a curl
line and the openai client."""

from __future__ import annotations

from secrets import token_urlsafe

from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QSpinBox,
                               QVBoxLayout, QWidget)

from app import secrets
from app.settings.preferences import Preferences
from app.ui.controllers.local_api import API_KEY_ENV, HOST, LocalApiKey
from app.ui.i18n import tr
from app.ui.widgets.system_page import key_storage_text

KEY_PLACEHOLDER = "YOUR_KEY"  # the example's stand-in while the key field hides the key


def base_url(port: int) -> str:
    """The OpenAI base URL of the tray's Local API on ``port``."""
    return f"http://{HOST}:{port}/v1"


def example_text(url: str, key: str, from_environment: bool = False) -> str:
    """A curl line and the openai client calling ``url`` with ``key`` ("": the API needs none;
    ``from_environment``: the shell's and Python's way to the variable instead of the key)."""
    if from_environment:
        header, python_key = f"${API_KEY_ENV}", f'os.environ["{API_KEY_ENV}"]'
    else:
        header, python_key = key, f'"{key or "none"}"'  # the client library wants some key
    auth = f' -H "Authorization: Bearer {header}"' if header else ""
    imports = "import os\nfrom openai import OpenAI" if from_environment else "from openai import OpenAI"
    return f'curl {url}/models{auth}\n\n{imports}\nclient = OpenAI(base_url="{url}", api_key={python_key})'


class LocalApiPage(QWidget):
    def __init__(self, prefs: Preferences, api_key: LocalApiKey, parent: QWidget | None = None):
        super().__init__(parent)
        self._api_key = api_key
        self.port = QSpinBox(minimum=1024, maximum=65535, value=prefs.local_api_port)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText(tr("Empty: clients need no key"))
        self.key.setToolTip(tr("Clients send it as the header Authorization: Bearer KEY"))
        self.show_key = QPushButton(tr("Show"), checkable=True)
        self.show_key.toggled.connect(self._show_key)
        self.generate = QPushButton(tr("Generate"))
        self.generate.clicked.connect(self.generate_key)
        self.key_note = QLabel(wordWrap=True)
        self.base_url = QLineEdit(readOnly=True)
        self.copy_url = QPushButton(tr("Copy"))
        self.copy_url.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.base_url.text()))
        self.example = QPlainTextEdit(readOnly=True, lineWrapMode=QPlainTextEdit.NoWrap)
        self.example.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.example.setFixedHeight(self.example.fontMetrics().lineSpacing() * 7)  # its 4 lines, a scroll bar
        self._kept = self._read_kept_key()  # what the field starts with: written again only when edited
        self.key.setText(self._kept)
        self.port.valueChanged.connect(self._refresh)
        self.key.textChanged.connect(self._refresh)
        form = QFormLayout()
        form.addRow(tr("Port"), self.port)
        form.addRow(tr("API key"), _row(self.key, self.show_key, self.generate))
        form.addRow("", self.key_note)
        form.addRow(tr("Base URL"), _row(self.base_url, self.copy_url))
        form.addRow(tr("Example"), self.example)
        page = QVBoxLayout(self)
        page.addLayout(form)
        page.addStretch(1)  # the rows at the top, not spread over the tab
        self._refresh()

    def _read_kept_key(self) -> str:
        """The key Settings keep, and the note under the field saying which key applies and where it is kept."""
        try:
            kept = self._api_key.kept()
        except secrets.SecretsError as e:
            self.key_note.setText(tr("The kept key cannot be read: {error}", error=str(e)))
            return ""
        if self._api_key.from_environment():
            note = tr("${variable} is set: clients must send its key, not this one (this one applies when "
                      "Qwen Tray starts without the variable)", variable=API_KEY_ENV)
        elif (reason := secrets.unavailable_reason()) is not None:
            note = tr("A key set here is not saved and lasts until Qwen Tray quits: {reason}", reason=reason)
        else:
            note = key_storage_text()  # the system keyring by its name, or keyrings.alt's file
        self.key_note.setText(note)
        return kept

    def _show_key(self, shown: bool) -> None:
        self.key.setEchoMode(QLineEdit.Normal if shown else QLineEdit.Password)
        self._refresh()

    def generate_key(self) -> None:
        """A new random key in the field, shown so that it can be copied into the clients."""
        self.key.setText(token_urlsafe(32))
        self.show_key.setChecked(True)

    def _refresh(self) -> None:
        url = base_url(self.port.value())
        self.base_url.setText(url)
        key = self.key.text().strip()
        shown = key if self.show_key.isChecked() or not key else KEY_PLACEHOLDER
        self.example.setPlainText(example_text(url, shown, from_environment=bool(self._api_key.from_environment())))

    def values(self) -> dict:
        """The preferences this page edits (the key is not one: see :meth:`edited_key`)."""
        return {"local_api_port": self.port.value()}

    def edited_key(self) -> str | None:
        """The key as edited ("": none), or None when the field still holds the kept one."""
        key = self.key.text().strip()
        return key if key != self._kept else None

    def key_applied(self) -> None:
        """The edited key is the kept one now (Apply): the next Apply does not write it again."""
        self._kept = self.key.text().strip()


def _row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    for index, widget in enumerate(widgets):
        row.addWidget(widget, 1 if index == 0 else 0)
    return row
