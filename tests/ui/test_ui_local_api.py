"""The tray's Local API with the real server on loopback: a start that fails (the port busy for a
moment) is reported and retried, and never saved as the user turning the API off."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

from ui_fakes import tray_with_real_local_api

from app.settings.store import SettingsStore
from app.ui.app import TrayApp
from app.ui.preferences import PreferencesStore


def _api_menu(app: TrayApp):
    app.tray.menu.aboutToShow.emit()
    return next(a.menu() for a in app.tray.menu.actions() if a.menu() is not None and a.text() == "Local API")


def test_a_busy_port_at_start_keeps_the_setting_and_turning_it_on_retries(qtbot):
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    PreferencesStore().update(local_api_enabled=True, local_api_port=port)
    app = tray_with_real_local_api()
    try:
        with qtbot.waitSignal(app.host.loaded, timeout=5000):
            app.start()
        qtbot.waitUntil(lambda: any("not running" in n for n in app.notices), timeout=5000)
        reason = f"cannot listen on 127.0.0.1:{port}: Address already in use"
        assert f"The local API is not running: {reason}; turn it on again in the menu (Local API) to retry" \
            in app.notices
        assert SettingsStore().load().preferences.local_api_enabled  # the next start tries again
        toggle, address = _api_menu(app).actions()[:2]
        assert not toggle.isChecked() and address.text() == f"Not running: {reason}"

        blocker.close()
        toggle.trigger()  # the user turns it on again: it starts now
        assert app.local_api.running
        try:  # the fake backend has no engine to serve: the server answers "loading", and so is listening
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10)
            raise AssertionError("a fake backend is not served as ready")
        except urllib.error.HTTPError as answer:
            assert answer.code == 503 and json.loads(answer.read())["state"] == "loading"
        assert _api_menu(app).actions()[1].text() == f"http://127.0.0.1:{port}/v1"
        _api_menu(app).actions()[0].trigger()  # turned off by the user: that is saved
        assert not app.local_api.running and not SettingsStore().load().preferences.local_api_enabled
    finally:
        blocker.close()
        app.shutdown()
