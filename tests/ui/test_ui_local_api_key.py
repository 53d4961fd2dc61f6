"""Settings → Local API with the real server on loopback and real HTTP requests: the API key set
there (or $QWEN_TRAY_API_KEY) is required at once, kept in the keyring (tests/conftest.py's file
keyring, or none at all) and never in settings.json; the page shows how to call the API."""

from __future__ import annotations

import http.client
import json
import socket

import keyring
import keyring.backend
import keyring.backends.fail
import keyring.errors
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QDialogButtonBox, QLineEdit
from ui_fakes import tray_with_real_local_api

from app import secrets
from app.server.config import API_KEY_ENV as SERVE_API_KEY_ENV
from app.settings.store import SettingsStore
from app.ui.app import TrayApp
from app.ui.controllers.local_api import API_KEY_ENV, LocalApi, LocalApiKey
from app.ui.preferences import PreferencesStore


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _models(port: int, key: str | None = None) -> tuple[int, str]:
    """GET /v1/models (with ``Authorization: Bearer KEY`` when a key is given): the status and the
    error code. Nothing is loaded (FakeOpener has no engine), so a request the key check passed gets
    503 model_loading, as before there was a key."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        response = conn.getresponse()
        body = json.loads(response.read())
        if response.status == 401:
            assert response.getheader("WWW-Authenticate") == "Bearer"  # serve's answer, to the letter
        return response.status, body["error"]["code"] if response.status != 200 else ""
    finally:
        conn.close()


PASSED = (503, "model_loading")
REFUSED = (401, "invalid_api_key")


@pytest.fixture
def tray(qtbot):
    """tray() -> a TrayApp with the real server behind its Local API, on and running on a free port."""
    apps = []

    def make() -> TrayApp:
        PreferencesStore().update(local_api_enabled=True, local_api_port=_free_port())
        app = tray_with_real_local_api()
        apps.append(app)
        with qtbot.waitSignal(app.host.loaded, timeout=5000):
            app.start()
        qtbot.waitUntil(lambda: app.local_api.running, timeout=5000)
        return app

    yield make
    for app in apps:
        app.shutdown()


def _local_api_page(app: TrayApp):
    app.open_settings()
    dialog = app.settings_dialog
    dialog.tabs.setCurrentWidget(dialog.local_api_page)
    return dialog, dialog.local_api_page


def _press(dialog, which) -> None:
    dialog.findChild(QDialogButtonBox).button(which).click()


class LockedKeyring(keyring.backend.KeyringBackend):
    """A keyring that will not tell (a Secret Service collection left locked): keyring's own error."""

    priority = 1

    def get_password(self, service, username):
        raise keyring.errors.KeyringLocked("the collection is locked")

    def set_password(self, service, username, password):
        raise keyring.errors.KeyringLocked("the collection is locked")

    def delete_password(self, service, username):
        raise keyring.errors.KeyringLocked("the collection is locked")


def test_the_variable_is_the_one_serve_reads():
    assert API_KEY_ENV == SERVE_API_KEY_ENV


def test_the_seam_alone_requires_the_variables_key(monkeypatch):
    """The review's reproduction: LocalApi by itself, $QWEN_TRAY_API_KEY set, GET /v1/models without a key."""
    monkeypatch.setenv(API_KEY_ENV, "sekret")
    api = LocalApi(lambda: None)  # the real app.server; nothing loaded
    port = _free_port()
    api.start(port)
    try:
        assert api.requires_key and _models(port) == REFUSED and _models(port, "sekret") == PASSED
    finally:
        api.stop()


def test_a_keyring_that_cannot_tell_the_key_keeps_the_api_stopped_not_open(qtbot):
    keyring.set_keyring(LockedKeyring())
    port = _free_port()
    PreferencesStore().update(local_api_enabled=True, local_api_port=port)
    app = tray_with_real_local_api()
    try:
        with qtbot.waitSignal(app.host.loaded, timeout=5000):
            app.start()
        qtbot.waitUntil(lambda: any("not running" in n for n in app.notices), timeout=5000)
        assert not app.local_api.running
        assert app.local_api.last_error == (f"cannot read the Local API's key from {secrets.backend_name()}: "
                                            "the collection is locked")
        with pytest.raises(ConnectionRefusedError):
            _models(port)
        assert SettingsStore().load().preferences.local_api_enabled  # the next start tries again
    finally:
        app.shutdown()


def test_a_generated_key_is_required_at_once_and_kept_in_the_keyring_not_the_file(qtbot, tray, test_keyring):
    app = tray()
    port = app.store.prefs.local_api_port
    assert _models(port) == PASSED  # no key yet, as before
    dialog, page = _local_api_page(app)
    assert page.key.text() == "" and page.key.echoMode() == QLineEdit.Password
    qtbot.mouseClick(page.generate, Qt.LeftButton)
    key = page.key.text()
    assert len(key) >= 40 and page.key.echoMode() == QLineEdit.Normal  # shown, to be copied
    assert f'curl http://127.0.0.1:{port}/v1/models -H "Authorization: Bearer {key}"' in page.example.toPlainText()
    started = sum("Local API running" in n for n in app.notices)
    _press(dialog, QDialogButtonBox.Apply)

    assert _models(port) == REFUSED  # the running API, without a restart
    assert _models(port, "not-the-key") == REFUSED
    assert _models(port, key) == PASSED
    assert sum("Local API running" in n for n in app.notices) == started
    assert key not in SettingsStore().path.read_text(encoding="utf-8")
    assert test_keyring.get_password("qwen-tray", "local-api") == key
    assert LocalApiKey().required() == key  # the next start of the tray requires it too


def test_changing_or_clearing_the_key_applies_at_once(qtbot, tray, test_keyring):
    secrets.set_local_api_key("first-key")  # kept by an earlier run
    app = tray()
    port = app.store.prefs.local_api_port
    assert _models(port) == REFUSED and _models(port, "first-key") == PASSED
    assert any(n.endswith("; clients must send its API key") for n in app.notices)
    dialog, page = _local_api_page(app)
    assert page.key.text() == "first-key" and page.key.echoMode() == QLineEdit.Password
    assert 'Bearer YOUR_KEY"' in page.example.toPlainText()  # a hidden key stays hidden
    page.key.setText("second-key")
    _press(dialog, QDialogButtonBox.Ok)
    assert app.settings_dialog is None  # closed
    assert _models(port, "first-key") == REFUSED and _models(port, "second-key") == PASSED

    dialog, page = _local_api_page(app)
    assert page.key.text() == "second-key"
    page.key.clear()
    _press(dialog, QDialogButtonBox.Ok)
    assert _models(port) == PASSED  # no key any more
    assert test_keyring.get_password("qwen-tray", "local-api") is None


def test_the_environment_variable_wins_and_settings_say_so(qtbot, tray, monkeypatch):
    secrets.set_local_api_key("kept-key")
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    app = tray()
    port = app.store.prefs.local_api_port
    assert _models(port) == REFUSED and _models(port, "kept-key") == REFUSED
    assert _models(port, "from-env") == PASSED
    dialog, page = _local_api_page(app)
    assert page.key_note.text().startswith("$QWEN_TRAY_API_KEY is set: clients must send its key")
    assert 'Bearer $QWEN_TRAY_API_KEY"' in page.example.toPlainText()
    assert 'api_key=os.environ["QWEN_TRAY_API_KEY"]' in page.example.toPlainText()
    assert "from-env" not in page.example.toPlainText() and page.key.text() == "kept-key"
    page.key.setText("new-kept-key")  # kept for a start without the variable; the variable still wins
    _press(dialog, QDialogButtonBox.Apply)
    assert _models(port, "from-env") == PASSED and _models(port, "new-kept-key") == REFUSED
    assert secrets.get_local_api_key() == "new-kept-key"


def test_without_a_keyring_the_key_protects_this_run_and_the_user_is_told(qtbot, tray):
    keyring.set_keyring(keyring.backends.fail.Keyring())  # a bare Linux: no keyring daemon
    app = tray()
    port = app.store.prefs.local_api_port
    dialog, page = _local_api_page(app)
    reason = secrets.unavailable_reason()
    assert page.key_note.text() == f"A key set here is not saved and lasts until Qwen Tray quits: {reason}"
    page.key.setText("run-only-key")
    _press(dialog, QDialogButtonBox.Apply)
    assert f"The Local API's key is not saved: {reason}; it applies until Qwen Tray quits" in app.notices
    assert _models(port) == REFUSED and _models(port, "run-only-key") == PASSED
    assert "run-only-key" not in SettingsStore().path.read_text(encoding="utf-8")  # never in the file


def test_the_page_shows_the_base_url_to_copy_and_a_new_port_moves_the_running_api(qtbot, tray):
    app = tray()
    old_port, new_port = app.store.prefs.local_api_port, _free_port()
    dialog, page = _local_api_page(app)
    assert page.base_url.text() == f"http://127.0.0.1:{old_port}/v1"
    page.port.setValue(new_port)
    assert page.base_url.text() == f"http://127.0.0.1:{new_port}/v1"
    assert f'client = OpenAI(base_url="http://127.0.0.1:{new_port}/v1", api_key="none")' \
        in page.example.toPlainText()
    qtbot.mouseClick(page.copy_url, Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == f"http://127.0.0.1:{new_port}/v1"
    _press(dialog, QDialogButtonBox.Apply)
    assert app.local_api.url == f"http://127.0.0.1:{new_port}/v1" and _models(new_port) == PASSED
    with pytest.raises(ConnectionRefusedError):
        _models(old_port)
    assert SettingsStore().load().preferences.local_api_port == new_port
