"""The tray gives the model's memory back when it is not used, says so, and loads it again for the
next request; the first kernel build shows a percentage. The real engine (tiny random Qwen2 on
the CPU) behind the real tray, with an idle time of a fraction of a second (EngineHost's
``set_idle_unload`` takes seconds; the preference is in minutes)."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QGuiApplication
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

from app.settings.models import ModelEntry
from app.settings.preferences import Preferences
from app.settings.store import SettingsStore

UNLOADED = "tiny unloaded to free memory; it loads again when needed"


def menu_status(app) -> str:
    app.tray.menu.aboutToShow.emit()
    return app.tray.menu.actions()[0].text()


@pytest.fixture
def tray(qtbot, tiny_qwen_dir):
    from app.ui.app import TrayApp

    with SettingsStore().edit() as settings:
        settings.add_model(ModelEntry("tiny", path=str(tiny_qwen_dir)))
        settings.preferences = Preferences(temperature=0, max_tokens=16)
    app = TrayApp(hotkey_factory=FakeHotkeys, injector=RecordingInjector(QGuiApplication.clipboard(), None))
    with qtbot.waitSignal(app.host.loaded, timeout=120000):
        app.start()
    yield app
    app.shutdown()


def test_an_idle_model_is_unloaded_and_the_next_action_loads_it_and_answers(qtbot, tray):
    engine = tray.host.backend.engine  # the ReloadingEngine the tray's backend holds
    first = []
    tray.action_controller.answered.connect(first.append)
    tray.run_action("summarize", text="The meeting moved from Tuesday to Friday at ten.")
    qtbot.waitUntil(lambda: len(first) == 1, timeout=120000)
    qtbot.waitUntil(lambda: not tray.host.busy, timeout=10000)  # (the answer is out; its task ends next)
    assert engine.is_loaded and " · CPU · ready · " in menu_status(tray)

    tray.host.set_idle_unload(0.2)
    qtbot.waitUntil(lambda: tray.host.state == "unloaded", timeout=60000)
    assert not engine.is_loaded and engine.engine is None  # weights and KV cache released
    assert menu_status(tray) == UNLOADED
    assert tray.host.backend is not None  # a hotkey still has somewhere to go

    states, popup_says = [], []
    tray.host.stateChanged.connect(lambda: states.append(tray.host.state))
    tray.host.stateChanged.connect(lambda: popup_says.append(tray.action_controller.popup.status.text()))
    again = []
    tray.action_controller.answered.connect(again.append)
    tray.run_action("summarize", text="The meeting moved from Tuesday to Friday at ten.")
    qtbot.waitUntil(lambda: len(again) == 1, timeout=120000)
    assert again == first[:1]  # loaded again, the same greedy answer
    assert "loading" in states and "ready" in states and states.index("loading") < states.index("ready")
    assert popup_says[states.index("loading")] == "Loading tiny…"  # the popup says why it waits
    qtbot.waitUntil(lambda: tray.host.state == "unloaded", timeout=60000)  # and idle again afterwards
    assert engine.unloads == 2


def test_the_chat_queues_a_message_while_the_model_loads_again(qtbot, tray):
    tray.host.set_idle_unload(0.2)
    qtbot.waitUntil(lambda: tray.host.state == "unloaded", timeout=60000)
    tray.open_chat()
    window = tray.chat_window
    window.input.setPlainText("hi")
    window.send_button.click()
    qtbot.waitUntil(lambda: len(window.conversation.messages) == 2, timeout=120000)
    assert window.conversation.messages[1].content  # answered after the load


def test_the_preference_sets_the_idle_time_and_zero_means_never(qtbot, tray):
    assert tray.host.idle_unload_seconds == 600  # the default: 10 minutes
    tray.store.update(idle_unload_minutes=3)
    assert tray.host.idle_unload_seconds == 180
    tray.store.update(idle_unload_minutes=0)
    assert tray.host.idle_unload_seconds is None
    assert tray.host.backend.engine.keep_alive is None


def test_settings_dialog_edits_the_idle_time(qtbot, tray):
    from app.ui.widgets.settings import SettingsDialog

    dialog = SettingsDialog(tray.store, tray.builtin_actions, tray.user_actions, [], [], lambda: ({}, {}),
                            tray.apply_settings)
    qtbot.addWidget(dialog)
    assert dialog.idle_unload.value() == 10
    dialog.idle_unload.setValue(0)
    assert dialog.idle_unload.text() == "Never"
    assert dialog.apply()
    assert tray.store.prefs.idle_unload_minutes == 0 and tray.host.idle_unload_seconds is None


def test_the_first_kernel_build_shows_a_percentage_in_both_languages(qtbot):
    from app.progress import KERNELS_STAGE
    from app.ui.app import TrayApp
    from app.ui.i18n import set_language
    from app.ui.widgets.tray import state_text

    app = TrayApp(opener=FakeOpener(), hotkey_factory=FakeHotkeys,
                  injector=RecordingInjector(QGuiApplication.clipboard(), None))
    try:
        app.host.state, app.host.entry = "loading", ModelEntry(name="Qwen2.5-3B", kind="local", path="/m")
        app.host.progress = (KERNELS_STAGE, 12, 40)
        assert state_text(app) == "Loading Qwen2.5-3B: building GPU kernels (first run)… 30%"
        set_language("zh_CN")
        assert state_text(app) == "正在加载 Qwen2.5-3B：首次运行，正在编译 GPU 内核… 30%"
        app.host.state = "unloaded"
        assert state_text(app) == "Qwen2.5-3B 已卸载以释放内存；需要时会重新加载"
    finally:
        app.shutdown()
