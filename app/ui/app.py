"""The tray application: wires the engine host, hotkeys, actions, chat, settings and tray.

``app.ui.launch.run_tray(argv)`` starts it (``qwen-tray`` without a subcommand).
"""

from __future__ import annotations

import logging
from pathlib import Path
from collections.abc import Callable
from dataclasses import replace

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.engine.cuda.fit import Machine
from app.errors import QwenTrayError
from app.hub.job import GotModel
from app.model_removal import Removal
from app.paths import log_file
from app.progress import format_bytes
from app.settings.actions import OPEN_CHAT_ID, Action
from app.settings.jsonfile import SettingsFileError
from app.settings.notices import Notice
from app.settings.store import SettingsStore
from app.ui.actions import DEFAULT_OPEN_CHAT_HOTKEY, load_builtin_actions, with_unique_ids
from app.ui.controllers.action_controller import ActionController
from app.ui.controllers.engine_host import EngineHost, Opener
from app.ui.controllers.history_keeper import HistoryKeeper
from app.ui.controllers.local_api import KEY_CHANGE, LocalApi, LocalApiError
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.controllers.model_removal import ModelRemoval, removal_summary
from app.ui.i18n import (current_language, install_qt_translation, missing_font_warning, notice_text, set_language,
                         tr)
from app.ui.models import ModelEntry, configured_models, open_backend
from app.ui.platform.clipboard_keeper import keep_clipboard_after_quit
from app.ui.platform.hotkeys import HotkeyManager, create_hotkey_backend
from app.ui.platform.keyinput import KeyInjector, create_key_injector
from app.ui.preferences import NOT_SAVED, PreferencesStore
from app.ui.widgets.system_page import open_folder
from app.ui.widgets.tray import TrayIcon, fill_app_menu

log = logging.getLogger(__name__)


class TrayApp(QObject):
    notified = Signal(str)  # every message shown to the user (the tray balloon, tests)

    def __init__(self, opener: Opener = open_backend, hotkey_factory: Callable = create_hotkey_backend,
                 injector: KeyInjector | None = None, server_finder: Callable | None = None,
                 with_tray_icon: bool = True, language: str | None = None):
        super().__init__()
        qapp = QApplication.instance()
        self._shut_down = False
        self._api_waits_for_load = False  # _start_api_once is connected to host.loaded
        self.notices: list[str] = []  # everything told to the user this run, oldest first
        self.store = PreferencesStore()
        first_start = not self.store.prefs.welcomed
        set_language(language or self.store.prefs.language)
        install_qt_translation(qapp)
        self.builtin_actions = load_builtin_actions()
        self.user_actions, renamed = with_unique_ids(self.store.settings.actions, self.builtin_actions)
        self.actions = [*self.builtin_actions, *self.user_actions]
        # A local model loads on the device the preferences name when its load starts.
        # (a remote one through the proxy they name)
        self.host = EngineHost(lambda entry, progress=None: opener(
            entry, progress=progress, device=self.store.prefs.device, proxy=self.store.prefs.network_proxy),
            parent=self)
        self.host.loadFailed.connect(lambda message: self.notify(tr("Could not load the model: {message}",
                                                                     message=message)))
        self.host.loaded.connect(self._notice_without_kernels)
        self.host.set_idle_unload(idle_unload_seconds(self.store.prefs.idle_unload_minutes))
        self.store.subscribe(lambda prefs: self.host.set_idle_unload(idle_unload_seconds(prefs.idle_unload_minutes)))
        self.hotkeys = HotkeyManager(hotkey_factory, parent=self)
        self.hotkeys.activated.connect(self._on_hotkey)
        self.injector = injector or create_key_injector()
        self.action_controller = ActionController(self.host, lambda: self.store.prefs, self.injector,
                                                  qapp.clipboard(), lambda: self.actions, parent=self)
        self.action_controller.notify.connect(self.notify)
        self.action_controller.continueInChat.connect(self.continue_in_chat)
        self.history = HistoryKeeper(lambda: self.store.prefs, self.notify, self.open_conversation, parent=self)
        self.action_controller.completed.connect(self.history.keep)
        self.model_jobs = ModelJobs(machine=self.machine, parent=self)  # downloads, GGUF imports
        self.model_jobs.finished.connect(self._model_ready)
        self.model_jobs.failed.connect(lambda message: self.notify(tr("Could not get the model: {message}",
                                                                      message=message)))
        self.model_removal = ModelRemoval(self.host, SettingsStore(self.store.path), parent=self)  # Settings: Remove
        self.model_removal.finished.connect(self._model_removed)
        self.model_removal.failed.connect(lambda message: self.notify(tr("Could not remove the model: {message}",
                                                                         message=message)))
        provider = lambda: getattr(self.host.backend, "engine", None)  # noqa: E731 - the API serves the local engine only
        self.local_api = LocalApi(provider, server_finder) if server_finder else LocalApi(provider)
        self.chat_window = None
        self.settings_dialog = None
        self.tray = None
        if with_tray_icon:
            self.tray = TrayIcon(self)
            self.tray.show()
        self.store.on_notice(self.notify)  # what was wrong with the settings file, and where it went
        font_warning = missing_font_warning()
        if font_warning is not None:
            log.warning("%s", font_warning)
            self.notify(font_warning)
        for notice in renamed:
            self.notify(notice)
        self.apply_hotkeys()
        if first_start and self.tray is not None:
            self._welcome()

    # -- notices ---------------------------------------------------------------------------------
    def notify(self, message: str | Notice) -> None:
        text = notice_text(message) if isinstance(message, Notice) else message
        log.info("notice: %s", text)
        self.notices.append(text)
        self.notified.emit(text)
        if self.tray is not None and QSystemTrayIcon.supportsMessages():
            self.tray.showMessage("Qwen Tray", text, QSystemTrayIcon.Information, 8000)

    def _welcome(self) -> None:
        """The first start: one notice saying where the app is and which hotkeys it listens to
        (as registered now); saved, so the next start is not a first one."""
        active = self.hotkeys.active
        pressed = ", ".join(f"{a.label(current_language())} {active[a.id]}" for a in self.actions if a.id in active)
        if not pressed:
            self.notify(tr("Qwen Tray is in the system tray: its menu has the actions, the chat and Settings."))
        elif OPEN_CHAT_ID in active:
            self.notify(tr("Qwen Tray is in the system tray. Select text and press {hotkeys}; {chat} opens the chat.",
                           hotkeys=pressed, chat=active[OPEN_CHAT_ID]))
        else:
            self.notify(tr("Qwen Tray is in the system tray. Select text and press {hotkeys}.", hotkeys=pressed))
        self.store.update(welcomed=True)

    def _notice_without_kernels(self) -> None:
        """Say once per load why a model on a GPU machine runs slower than it could."""
        backend = self.host.backend
        if backend is None or backend.kernels_unavailable is None:
            return
        reason = backend.kernels_unavailable
        if backend.device == "cuda":
            self.notify(tr("{model} runs with PyTorch on the GPU, without its CUDA kernels (slower): {reason}",
                           model=backend.name, reason=reason))
        else:
            self.notify(tr("{model} runs on the CPU: too large for the GPU without its CUDA kernels, which cannot run here: {reason}",
                           model=backend.name, reason=reason))

    # -- models ------------------------------------------------------------------------------------
    def models(self) -> list[ModelEntry]:
        return configured_models(self.store.refresh().models)

    def switch_to_named(self, name_or_path: str) -> None:
        """``--model``: a registered model by name, else a folder (`qwen-tray tray` hands over an
        absolute path it checked)."""
        entry = next((m for m in self.models() if m.name == name_or_path), None)
        self.host.switch_to(entry or ModelEntry(name=Path(name_or_path).name, kind="local", path=name_or_path))

    def start(self) -> None:
        """Load the active model (or the first configured one) in the background."""
        models = self.models()
        wanted = self.store.prefs.active_model or self.store.settings.default_model
        entry = next((m for m in models if m.name == wanted), models[0])
        self.host.switch_to(entry)
        self._start_api_when_loaded(entry)

    def _start_api_when_loaded(self, entry: ModelEntry) -> None:
        """The Local API, when the user turned it on, starts once the local model is loaded."""
        wanted = entry.is_local_engine and self.store.prefs.local_api_enabled and not self.local_api.running
        if wanted and not self._api_waits_for_load:
            self._api_waits_for_load = True
            self.host.loaded.connect(self._start_api_once)

    def _start_api_once(self) -> None:
        self.host.loaded.disconnect(self._start_api_once)
        self._api_waits_for_load = False
        if self.host.entry.is_local_engine and not self.local_api.running:
            self.set_local_api(True)

    def switch_model(self, entry: ModelEntry) -> None:
        if not entry.is_local_engine and self.local_api.running:
            # It serves the local engine only. Stopped, not turned off: the preference stays, and
            # switching back to a local model starts it again.
            self.local_api.stop()
        self.store.update(active_model=entry.name)
        self.host.switch_to(entry)
        self._start_api_when_loaded(entry)

    def machine(self) -> Machine:
        """This machine for the VRAM planner, counting the VRAM the loaded model would give back;
        no GPU when Settings keep local models on the CPU (nor is CUDA started for the question)."""
        if self.store.prefs.device == "cpu":
            return Machine(None, "Settings run local models on the CPU")
        machine = Machine.detect()
        held = self.host.backend.vram_bytes() if self.host.backend is not None else None
        if machine.gpu is not None and held:
            machine = replace(machine, gpu=replace(machine.gpu, free_bytes=machine.gpu.free_bytes + held))
        return machine

    def _model_ready(self, got: GotModel, activate: bool) -> None:
        """A model job registered a model: say where it runs, and switch to it if asked."""
        self.notify(tr("{model} is ready", model=got.name))
        if got.fit is not None and not got.fit.on_gpu and self.model_jobs.machine().gpu is not None:
            self.notify(tr("{model} does not fit this GPU: {verdict}", model=got.name, verdict=got.fit.text))
        if got.source_left is not None:  # a file in the download still in use (Windows): gigabytes, said
            self.notify(tr("The download {folder} ({size}) could not be deleted completely (a file in it was in use); "
                           "it can be deleted once Qwen Tray is closed", folder=str(got.source_left),
                           size=format_bytes(got.source_left_bytes)))
        if activate:
            self.switch_model(ModelEntry(name=got.name, kind="local", path=str(got.path)))

    def _model_removed(self, removal: Removal, in_use: bool) -> None:
        """Settings removed a model: say what happened; if the tray was using it, it goes on with
        the default model (unless another one was chosen meanwhile)."""
        self.store.forget_model(removal.plan.entry.name)
        self.notify(removal_summary(removal))
        if in_use and self.host.entry is None:
            models = self.models()
            self.switch_model(next((m for m in models if m.name == removal.default), models[0]))

    # -- hotkeys and actions ---------------------------------------------------------------------
    def effective_hotkeys(self) -> dict[str, str]:
        overrides = self.store.prefs.hotkeys
        bindings = {a.id: overrides.get(a.id, a.hotkey) for a in self.actions}
        bindings[OPEN_CHAT_ID] = overrides.get(OPEN_CHAT_ID, DEFAULT_OPEN_CHAT_HOTKEY)
        return bindings

    def apply_hotkeys(self) -> dict[str, str]:
        failures = self.hotkeys.apply(self.effective_hotkeys())
        for binding_id, reason in failures.items():
            self.notify(tr("Hotkey for {name} not registered: {reason}", name=self._binding_label(binding_id),
                           reason=reason))
        return failures

    def _binding_label(self, binding_id: str) -> str:
        action = next((a for a in self.actions if a.id == binding_id), None)
        return action.label(current_language()) if action else tr("Open chat")

    def _on_hotkey(self, binding_id: str) -> None:
        if binding_id == OPEN_CHAT_ID:
            self.open_chat()
            return
        self.run_action(binding_id)

    def run_action(self, action_id: str, text: str | None = None) -> None:
        """Run an action on ``text``, or with None on the selection of the focused window."""
        self.action_controller.run_action(action_id, text)

    def run_on_clipboard(self, action_id: str) -> None:
        """The tray menu's actions: the menu took the focus, so they work on the clipboard."""
        self.action_controller.run_on_clipboard(action_id)

    # -- windows -------------------------------------------------------------------------------------
    def open_chat(self) -> None:
        if self.chat_window is None:
            from app.ui.widgets.chat import ChatWindow

            # Without a system tray the chat window is the only way in: it carries the menu,
            # and closing it quits (else the app would run on with nothing on the screen).
            no_tray = self.tray is None
            self.chat_window = ChatWindow(self.host, self.store, self.history.chats,
                                          fill_menu=(lambda menu: fill_app_menu(menu, self)) if no_tray else None)
            if no_tray:
                self.chat_window.closed.connect(self._chat_closed_without_tray)
                self.notified.connect(self.chat_window.show_notice)  # no balloons: its status line says it
                if self.notices:
                    self.chat_window.show_notice(self.notices[-1])
            for notice in self.chat_window.notices:
                self.notify(notice)
        self.chat_window.show()
        self.chat_window.raise_()
        self.chat_window.activateWindow()
        self.chat_window.input.setFocus()

    def _chat_closed_without_tray(self) -> None:
        log.info("the chat window was closed and there is no system tray: quitting")
        self.quit()

    def open_conversation(self, conversation_id: str) -> None:
        """A conversation from the History window, in the chat window."""
        self.open_chat()
        self.chat_window.open_conversation(conversation_id)

    def open_history(self) -> None:
        self.history.open_window()

    def open_log_folder(self) -> None:
        if not open_folder(log_file().parent):
            self.notify(tr("Could not open {folder}; the log is {file}", folder=str(log_file().parent),
                           file=str(log_file())))

    def continue_in_chat(self, messages: list[dict], title: str) -> None:
        """A popup's request and answer become a new conversation in the chat window."""
        self.open_chat()
        self.chat_window.start_conversation(messages, title)

    def open_settings(self) -> None:
        from app.ui.widgets.settings import SettingsDialog

        if self.settings_dialog is None:
            models = self.models()
            builtin_models = [m for m in models if m.kind == "starter"]  # not removable
            editable = [m for m in models if m.kind != "starter"]  # registered folders + remote endpoints
            self.settings_dialog = SettingsDialog(
                self.store, self.builtin_actions, self.user_actions, builtin_models, editable,
                lambda: (self.hotkeys.active, self.hotkeys.failures), self.apply_settings,
                model_jobs=self.model_jobs, model_removal=self.model_removal, api_key=self.local_api.api_key)
            self.settings_dialog.recording_hotkey.connect(self._recording_hotkey)
            self.settings_dialog.finished.connect(self._settings_closed)
        self.settings_dialog.show()
        self.settings_dialog.raise_()

    def _recording_hotkey(self, recording: bool) -> None:
        if recording:
            self.hotkeys.suspend()
        else:
            self.hotkeys.resume()

    def _settings_closed(self, _result: int) -> None:
        self.settings_dialog = None
        self.hotkeys.resume()  # a field that had the focus when the dialog went

    def apply_settings(self, changes: dict, user_actions: list[Action]) -> None:
        """Take what Settings changed into use and save it (raises QwenTrayError naming a bad value,
        before anything changed; or saying the change could not be saved, after it took effect)."""
        user_actions, renamed = with_unique_ids(user_actions, self.builtin_actions)
        changes = dict(changes)
        api_key = changes.pop(KEY_CHANGE, None)  # not a preference: kept in the keyring
        before = self.store.prefs
        device_changed = changes.get("device", before.device) != before.device
        port_changed = changes.get("local_api_port", before.local_api_port) != before.local_api_port
        try:
            self.store.change(actions=user_actions, **changes)
            not_saved = None
        except SettingsFileError as e:
            not_saved = e
        self.user_actions, self.actions = user_actions, [*self.builtin_actions, *user_actions]
        for notice in renamed:
            self.notify(notice)
        self.apply_hotkeys()
        entry = self.host.entry
        if device_changed and entry is not None and entry.is_local_engine:
            self.host.switch_to(entry)  # load it again where it should run now
        self._apply_local_api_settings(api_key, port_changed)
        if not_saved is not None:
            raise QwenTrayError(tr(NOT_SAVED, error=str(not_saved)))

    # -- local API --------------------------------------------------------------------------------------
    def set_local_api(self, enabled: bool) -> None:
        try:
            if enabled:
                url = self.local_api.start(self.store.prefs.local_api_port)
                self.notify(tr("Local API running at {url}; clients must send its API key", url=url)
                            if self.local_api.requires_key else tr("Local API running at {url}", url=url))
            else:
                self.local_api.stop()
        except (LocalApiError, QwenTrayError) as e:
            # Not saved as off: a port busy for a moment must not turn the user's API off for good;
            # the menu says why it is not running, and turning it on (or the next start) tries again.
            self.notify(tr("The local API is not running: {error}; turn it on again in the menu "
                           "(Local API) to retry", error=str(e)))
            return
        if enabled != self.store.prefs.local_api_enabled:
            self.store.update(local_api_enabled=enabled)

    def _apply_local_api_settings(self, api_key: str | None, port_changed: bool) -> None:
        """Settings changed the key (None: not) or the port: the running API requires the new key
        from its next request on, and moves to the new port."""
        not_kept = self.local_api.change_key(api_key) if api_key is not None else None
        if not_kept is not None:
            self.notify(tr("The Local API's key is not saved: {reason}; it applies until Qwen Tray quits",
                           reason=not_kept))
        if port_changed and self.local_api.running:
            self.local_api.stop()
            self.set_local_api(True)  # (says where it runs now, or why it does not)

    # -- quitting ---------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self.action_controller.shutdown()
        # X11: the clipboard the tray owns (the user's, put back after an action) outlives it.
        keep_clipboard_after_quit(QApplication.clipboard())
        self.model_jobs.shutdown()  # what it did is kept: the next start of the job resumes
        self.model_removal.wait(30)  # a deletion cut short is finished by the next work on the name
        self.local_api.stop()
        self.hotkeys.close()
        self.injector.close()
        if self.chat_window is not None:  # its answer saved as far as it got, before the engine goes
            self.chat_window.shutdown()
        self.host.shutdown()
        if self.tray is not None:
            self.tray.hide()

    def quit(self) -> None:
        self.shutdown()
        QApplication.instance().quit()


def idle_unload_seconds(minutes: int) -> float | None:
    """The preference (0 = never) as EngineHost takes it."""
    return minutes * 60.0 if minutes > 0 else None
