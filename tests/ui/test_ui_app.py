"""The tray app offscreen: menu from state, model switching, hotkeys with conflicts, settings,
local-API seam, language, recovery from a corrupt preferences file."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QGuiApplication
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

from app.ui.actions import load_user_actions
from app.ui.app import TrayApp
from app.settings import load_settings
from app.ui.models import STARTER_NAME, ModelEntry, save_local_models
from app.ui.preferences import Preferences, load_preferences, preferences_path

LOCAL_B = ModelEntry("Qwen2.5-3B w4", path="/models/qwen2.5-3b-w4")


class FakeServer:
    def __init__(self):
        self.calls, self.stopped = [], 0

    def start(self, provider, host, port):
        self.calls.append((provider, host, port))
        server = self

        class Handle:
            url = f"http://{host}:{port}/v1"

            def stop(self):
                server.stopped += 1

        return Handle()


@pytest.fixture
def make_app(qtbot):
    apps = []

    def make(opener=None, taken=(), server=None, language=None, selection="selected words here"):
        FakeHotkeys.taken = set(taken)
        clipboard = QGuiApplication.clipboard()
        missing = (None, "app.server has no start_server_in_thread()")
        finder = (lambda: (server.start, "")) if server else (lambda: missing)
        app = TrayApp(opener=opener or FakeOpener(), hotkey_factory=FakeHotkeys,
                      injector=RecordingInjector(clipboard, selection), server_finder=finder, language=language)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown()
    FakeHotkeys.taken = set()


def _menu_texts(menu):
    menu.aboutToShow.emit()
    return [a.text() for a in menu.actions() if not a.isSeparator()]


def _submenu(menu, title):
    return next(a.menu() for a in menu.actions() if a.menu() is not None and a.text() == title)


def _start(qtbot, app):
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()


def test_menu_is_built_from_state(qtbot, make_app):
    app = make_app()
    assert _menu_texts(app.tray.menu)[0] == "No model loaded"
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()
        assert _menu_texts(app.tray.menu)[0] == "Loading SmolLM2-135M-Instruct…"
        assert all(not a.isEnabled() for a in app.tray.menu.actions()[2:7])  # actions wait for the model
    texts = _menu_texts(app.tray.menu)
    assert texts[0] == f"Ready · {app.host.backend.max_context} tokens of context"
    assert texts[1:6] == ["Summarize\tCtrl+Alt+S", "Translate\tCtrl+Alt+T", "Extract to-dos\tCtrl+Alt+D",
                          "Rewrite / polish\tCtrl+Alt+R", "Explain"]
    assert texts[6:] == ["Open chat", "Model", "Local API", "Settings…", "Quit"]
    models = _submenu(app.tray.menu, "Model")
    assert [(a.text(), a.isChecked()) for a in models.actions()] == [(STARTER_NAME, True)]
    api = _submenu(app.tray.menu, "Local API")
    assert not api.isEnabled()  # app.server lacks the start function in this test
    assert "start_server_in_thread" in api.actions()[0].text()
    assert STARTER_NAME in app.tray.toolTip() and "fake · cpu" not in app.tray.toolTip()
    assert f"{STARTER_NAME} · cpu" in app.tray.toolTip()


@pytest.mark.parametrize("device,expected", [
    ("cuda", "{model} runs with PyTorch on the GPU, without its CUDA kernels (slower): {reason}"),
    ("cpu", "{model} runs on the CPU: too large for the GPU without its CUDA kernels, which cannot run here: "
            "{reason}")])
def test_a_model_without_the_kernels_is_told_once_per_load(qtbot, make_app, device, expected):
    reason = "GPU NVIDIA GeForce GTX 1650 has compute capability 7.5; the kernels need 8.0 or newer"
    app = make_app(opener=FakeOpener(device=device, kernels_unavailable=reason))
    _start(qtbot, app)
    told = [n for n in app.notices if reason in n]
    assert told == [expected.format(model=app.host.backend.name, reason=reason)]


def test_a_model_the_kernels_serve_brings_no_notice(qtbot, make_app):
    app = make_app()
    _start(qtbot, app)
    assert app.notices == []


def test_switching_model_from_the_menu_frees_the_old_one_first(qtbot, make_app):
    save_local_models([LOCAL_B])  # registered like `qwen-tray models add`: the default model
    opener = FakeOpener()
    app = make_app(opener=opener)
    _start(qtbot, app)
    assert app.host.entry == LOCAL_B
    app.tray.menu.aboutToShow.emit()
    models = _submenu(app.tray.menu, "Model")
    assert [(a.text(), a.isChecked()) for a in models.actions()] == [(STARTER_NAME, False), (LOCAL_B.name, True)]
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        models.actions()[0].trigger()
    assert opener.log == [("open", LOCAL_B.name), ("close", LOCAL_B.name), ("open", STARTER_NAME)]
    app.tray.menu.aboutToShow.emit()
    checked = [a.text() for a in _submenu(app.tray.menu, "Model").actions() if a.isChecked()]
    assert checked == [STARTER_NAME]
    assert load_preferences()[0].active_model == STARTER_NAME  # remembered for the next start


def test_settings_move_the_local_model_to_the_cpu_and_back(qtbot, make_app):
    opener = FakeOpener()
    app = make_app(opener=opener)
    _start(qtbot, app)
    app.open_settings()
    dialog = app.settings_dialog
    assert dialog.device.currentData() == "auto"
    dialog.device.setCurrentIndex(dialog.device.findData("cpu"))
    with qtbot.waitSignal(app.host.loaded, timeout=5000):  # the model loads again, on the CPU
        assert dialog.apply()
    assert opener.devices == ["auto", "cpu"]
    assert opener.log == [("open", STARTER_NAME), ("close", STARTER_NAME), ("open", STARTER_NAME)]
    assert load_preferences()[0].device == "cpu"  # and the next start loads it there too
    assert dialog.apply()  # nothing changed: no reload
    assert opener.devices == ["auto", "cpu"]


def test_hotkeys_registered_and_conflicts_reported(qtbot, make_app):
    app = make_app(taken={"Ctrl+Alt+T"})
    backend = FakeHotkeys.instances[-1]
    assert backend.registered == {"summarize": "Ctrl+Alt+S", "todos": "Ctrl+Alt+D", "rewrite": "Ctrl+Alt+R",
                                  "open_chat": "Ctrl+Alt+Space"}
    assert set(app.hotkeys.failures) == {"translate"}
    assert any("Translate" in n and "already taken" in n for n in app.notices)


def test_hotkey_press_from_the_os_thread_runs_the_action(qtbot, make_app):
    app = make_app(selection="The launch moved to May 4.")
    _start(qtbot, app)
    answers = []
    app.action_controller.answered.connect(answers.append)
    FakeHotkeys.instances[-1].press("summarize")
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    assert answers == ["Summary: to May 4."]
    FakeHotkeys.instances[-1].press("open_chat")
    qtbot.waitUntil(lambda: app.chat_window is not None and app.chat_window.isVisible(), timeout=5000)


def test_settings_change_hotkeys_and_add_a_user_action(qtbot, make_app):
    app = make_app()
    app.open_settings()
    dialog = app.settings_dialog
    table = dialog.hotkeys_table
    row = next(r for r in range(table.rowCount()) if table.item(r, 0).data(256) == "summarize")
    table.cellWidget(row, 1).setText("s")  # not allowed: no modifier
    assert not dialog.apply()
    assert "needs Ctrl, Alt or Super" in dialog.error.text()
    assert not preferences_path().exists()  # nothing half-applied

    table.cellWidget(row, 1).setText("ctrl+alt+q")
    page = dialog.actions_page
    page.name.setText("Formal tone")
    page.prompt.setPlainText("Make this formal:\n\n{text}")
    page.hotkey.setText("ctrl+alt+f")
    assert page.save_current()
    assert dialog.apply()
    assert load_preferences()[0].hotkeys == {"summarize": "Ctrl+Alt+Q"}
    saved, _ = load_user_actions()
    assert [(a.id, a.hotkey) for a in saved] == [("user-formal-tone", "Ctrl+Alt+F")]
    registered = FakeHotkeys.instances[-1].registered
    assert registered["summarize"] == "Ctrl+Alt+Q" and registered["user-formal-tone"] == "Ctrl+Alt+F"
    assert "Formal tone\tCtrl+Alt+F" in _menu_texts(app.tray.menu)
    status = {table.item(r, 0).data(256): table.item(r, 3).text() for r in range(table.rowCount())}
    assert status["summarize"] == "registered" and status["explain"] == "off"


def test_settings_report_a_hotkey_the_os_refuses(qtbot, make_app):
    app = make_app(taken={"Ctrl+Alt+Q"})
    app.open_settings()
    table = app.settings_dialog.hotkeys_table
    row = next(r for r in range(table.rowCount()) if table.item(r, 0).data(256) == "rewrite")
    table.cellWidget(row, 1).setText("Ctrl+Alt+Q")
    assert app.settings_dialog.apply()
    assert "already taken" in table.item(row, 3).text()
    assert "rewrite" not in FakeHotkeys.instances[-1].registered


def test_local_api_toggle_uses_the_server_seam(qtbot, make_app):
    server = FakeServer()
    app = make_app(server=server)
    _start(qtbot, app)
    api = _submenu(app.tray.menu, "Local API")
    app.tray.menu.aboutToShow.emit()
    api = _submenu(app.tray.menu, "Local API")
    toggle = api.actions()[0]
    assert api.isEnabled() and toggle.isEnabled() and not toggle.isChecked()
    toggle.trigger()
    provider, host, port = server.calls[0]
    assert (host, port) == ("127.0.0.1", 18000)
    assert provider() is getattr(app.host.backend, "engine", None)  # serves whatever engine is current
    app.tray.menu.aboutToShow.emit()
    api = _submenu(app.tray.menu, "Local API")
    assert api.actions()[0].isChecked() and api.actions()[1].text() == "http://127.0.0.1:18000/v1"
    assert load_preferences()[0].local_api_enabled
    api.actions()[0].trigger()
    assert server.stopped == 1 and not load_preferences()[0].local_api_enabled


def test_chinese_ui(qtbot, make_app):
    app = make_app(language="zh_CN")
    _start(qtbot, app)
    texts = _menu_texts(app.tray.menu)
    assert texts[0] == f"就绪 · 上下文 {app.host.backend.max_context} token"
    assert "总结\tCtrl+Alt+S" in texts and "打开对话" in texts and "退出" in texts


def test_corrupt_preferences_do_not_stop_the_app(qtbot, make_app):
    path = preferences_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"hotkeys": ', encoding="utf-8")
    app = make_app()
    assert any("reset to defaults" in n for n in app.notices)
    assert app.store.prefs == Preferences()
    _start(qtbot, app)
    assert app.host.state == "ready"


def test_tray_icon_follows_state(qtbot, make_app):
    app = make_app(opener=FakeOpener(fail={STARTER_NAME}))
    with qtbot.waitSignal(app.host.loadFailed, timeout=5000):
        app.start()
    assert "config.json not found" in app.tray.toolTip()
    assert any("Could not load the model" in n for n in app.notices)
    assert _menu_texts(app.tray.menu)[0].startswith("Error: ")


def test_settings_add_models_local_to_the_core_registry_remote_to_preferences(qtbot, make_app, tmp_path):
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.models_page
    page.name.setText("Qwen2.5-7B mixed")
    page.path.setText(str(tmp_path / "qwen7b-mixed"))
    assert page.add_from_form()
    page.kind.setCurrentIndex(page.kind.findData("remote"))
    page.name.setText("Qwen2.5-7B mixed")
    assert not page.add_from_form() and "already exists" in page.error.text()
    page.name.setText("DashScope")
    page.base_url.setText("https://dashscope.example.com/compatible-mode/v1")
    page.api_key.setText("sk-123")
    page.model.setText("qwen-plus")
    assert page.add_from_form()
    assert app.settings_dialog.apply()
    settings = load_settings()
    assert settings.models == {"Qwen2.5-7B mixed": str(tmp_path / "qwen7b-mixed")}  # `qwen-tray models list` sees it
    assert settings.default_model == "Qwen2.5-7B mixed"
    assert [m.name for m in load_preferences()[0].models] == ["DashScope"]
    app.tray.menu.aboutToShow.emit()
    names = [a.text() for a in _submenu(app.tray.menu, "Model").actions()]
    assert names == [STARTER_NAME, "Qwen2.5-7B mixed", "DashScope"]


def test_run_tray_starts_the_event_loop_and_quits_cleanly(qtbot, qapp, monkeypatch, tmp_path, ui_home):
    """What `qwen-tray` with no subcommand runs (the CLI calls run_tray(argv))."""
    from PySide6.QtCore import QTimer

    from app.ui import app as app_module

    monkeypatch.delenv("DISPLAY", raising=False)  # never grab the developer's real keys
    save_local_models([ModelEntry("missing", path=str(tmp_path / "no-such-model"))])
    started = []
    real_init = app_module.TrayApp.__init__

    def spy_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(app_module.TrayApp, "__init__", spy_init)
    def quit_after_failure():
        # Quit once the (missing) model has failed to load: the loop ran and the app reacted.
        tray = started[0]
        if tray.host.state == "error":
            tray.quit()
        else:
            tray.host.loadFailed.connect(lambda _m: tray.quit())

    QTimer.singleShot(0, quit_after_failure)
    QTimer.singleShot(60000, lambda: started[0].quit())  # never hang the suite
    try:
        assert app_module.run_tray(["--language", "en"]) == 0
    finally:
        qapp.setQuitOnLastWindowClosed(True)
    tray = started[0]
    assert tray.host.state == "empty"  # shut down
    assert any("no-such-model" in n for n in tray.notices)
    assert any("global hotkeys are unavailable" in n for n in tray.notices)
    log = (ui_home / "data" / "qwen-tray.log").read_text(encoding="utf-8")
    assert "no-such-model" in log  # no console under pythonw: the log file tells what happened


def test_status_line_says_when_the_gpu_is_being_prepared(make_app):
    """After the weights are read a CUDA load moves them, compiles the kernels on a first run and
    captures its graphs: one stage without a percentage."""
    from app.progress import GPU_STAGE
    from app.ui.widgets.tray import state_text

    app = make_app()
    app.host.state, app.host.entry = "loading", ModelEntry(name="Qwen2.5-7B", kind="local", path="/models/7b")
    app.host.progress = ("weights", 50, 100)
    assert state_text(app) == "Loading Qwen2.5-7B… 50%"
    app.host.progress = (GPU_STAGE, 0, 1)
    assert state_text(app) == "Loading Qwen2.5-7B: preparing the GPU…"


def test_status_line_shows_the_vram_a_gpu_model_holds(qtbot, make_app):
    app = make_app(opener=FakeOpener(vram=int(3.2 * 2**30), max_context=3712), language="zh_CN")
    _start(qtbot, app)
    assert _menu_texts(app.tray.menu)[0] == "就绪 · 上下文 3712 token · 显存 3.20 GiB"
    assert "显存 3.20 GiB" in app.tray.toolTip()
