"""The Settings dialog: general options, hotkeys (with what the OS refused), actions, models, the
Local API (port, key, how to call it), system (start at login, history, proxy, where keys and the log are)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QGroupBox, QLabel,
                               QSizePolicy, QSpinBox, QTabWidget, QVBoxLayout, QWidget)

from app.errors import QwenTrayError
from app.settings.actions import OPEN_CHAT_ID, Action
from app.settings.models import ModelEntry, rebase_models
from app.settings.store import SettingsStore
from app.ui.actions import DEFAULT_OPEN_CHAT_HOTKEY
from app.ui.controllers.local_api import KEY_CHANGE, LocalApiKey
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.controllers.model_removal import ModelRemoval
from app.ui.i18n import current_language, tr
from app.ui.preferences import PreferencesStore
from app.ui.widgets.catalog_page import CatalogPage
from app.ui.widgets.hotkeys_page import BindingRow, HotkeysPage
from app.ui.widgets.icons import app_icon
from app.ui.widgets.local_api_page import LocalApiPage
from app.ui.widgets.settings_pages import ActionsPage, ModelsPage
from app.ui.widgets.system_page import SystemPage

TRANSLATE_TARGETS = ("auto", "English", "Simplified Chinese", "Traditional Chinese", "Japanese", "Korean",
                     "French", "German", "Spanish")


def translate_target_labels() -> dict[str, str]:
    """What the "Translate into" list shows for each stored value (the value goes into the prompt)."""
    return {"auto": tr("Automatic: Chinese into English, anything else into Chinese"),
            "English": tr("English"), "Simplified Chinese": tr("Simplified Chinese"),
            "Traditional Chinese": tr("Traditional Chinese"), "Japanese": tr("Japanese"), "Korean": tr("Korean"),
            "French": tr("French"), "German": tr("German"), "Spanish": tr("Spanish")}

IDLE_UNLOAD_TIP = ("The model's VRAM and memory are given back after this long without use; "
                   "the next request loads it again")


class SettingsDialog(QDialog):
    # a hotkey field (Hotkeys page, or the action being edited) took (True) or lost the keyboard
    recording_hotkey = Signal(bool)

    def __init__(self, store: PreferencesStore, builtin_actions: list[Action], user_actions: list[Action],
                 builtin_models: list[ModelEntry], user_models: list[ModelEntry],
                 hotkey_status: Callable[[], tuple[dict, dict]],
                 on_apply: Callable[[dict, list[Action]], None], parent: QWidget | None = None,
                 model_jobs: ModelJobs | None = None, model_removal: ModelRemoval | None = None,
                 api_key: LocalApiKey | None = None):
        super().__init__(parent)
        self.setWindowTitle(tr("Qwen Tray settings"))
        self.setWindowIcon(app_icon())
        self.store, self._builtin_actions = store, builtin_actions
        self._hotkey_status = hotkey_status  # () -> (active {id: hotkey}, failures {id: reason})
        self._on_apply = on_apply  # saves preferences + user actions and re-registers hotkeys
        self.tabs = QTabWidget()
        self.tabs.addTab(self._general_page(), tr("General"))
        self.hotkeys_page = HotkeysPage(self._binding_rows)
        self.hotkeys_page.set_copy_rules(store.prefs.copy_shortcuts)
        self.tabs.addTab(self.hotkeys_page, tr("Hotkeys"))
        self.actions_page = ActionsPage(user_actions, {a.id for a in builtin_actions})
        self.actions_page.changed.connect(self._fill_hotkeys)
        self.hotkeys_page.recording.connect(self.recording_hotkey)
        self.actions_page.hotkey.recording.connect(self.recording_hotkey)
        self.tabs.addTab(self.actions_page, tr("Actions"))
        # Removing a model takes effect when confirmed (not on OK): the tray's remover, which can
        # unload the model first; a dialog of its own has nothing loaded to let go of.
        removal = model_removal or ModelRemoval(None, SettingsStore(store.path), parent=self)
        self.models_page = ModelsPage(builtin_models, user_models, removal, jobs=model_jobs)
        self.models_page.removed.connect(self._model_removed)
        self._models_shown = list(user_models)  # the registry as this dialog knows it (rebase_models)
        self.catalog_page = CatalogPage(model_jobs, store) if model_jobs is not None else None
        self.tabs.addTab(_models_tab(self.catalog_page, self.models_page), tr("Models"))
        self.local_api_page = LocalApiPage(store.prefs, api_key or LocalApiKey())  # (the tray's: the key it uses)
        self.tabs.addTab(self.local_api_page, tr("Local API"))
        self.system_page = SystemPage(store.prefs)
        self.tabs.addTab(self.system_page, tr("System"))
        self.error = QLabel(wordWrap=True)
        self.error.setStyleSheet("color: #b91c1c")
        # A long error wraps instead of widening the dialog (its width would be the whole line's).
        self.error.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Apply | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self._ok)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.Apply).clicked.connect(self.apply)
        self._save_buttons = [buttons.button(QDialogButtonBox.Ok), buttons.button(QDialogButtonBox.Apply)]
        removal.runningChanged.connect(self._removal_running)
        self._removal_running(removal.running)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(self.error)
        layout.addWidget(buttons)
        self._fill_hotkeys()
        self.resize(820, 720)

    def _general_page(self) -> QWidget:
        prefs = self.store.prefs
        page = QWidget()
        form = QFormLayout(page)
        self.language = QComboBox()
        for value, label in (("auto", tr("System default")), ("en", "English"), ("zh_CN", "简体中文")):
            self.language.addItem(label, value)
        self.language.setCurrentIndex(self.language.findData(prefs.language))
        self.translate_target = QComboBox(editable=True)  # any language the model knows may be typed in
        for value, label in translate_target_labels().items():
            self.translate_target.addItem(label, value)
        index = self.translate_target.findData(prefs.translate_target)
        if index >= 0:
            self.translate_target.setCurrentIndex(index)
        else:
            self.translate_target.setCurrentText(prefs.translate_target)
        self.max_tokens = QSpinBox(minimum=16, maximum=8192, value=prefs.max_tokens, singleStep=64)
        self.max_tokens.setToolTip(tr("An answer gets at most half of the model's context, so the text or the "
                                      "conversation before it still fits"))
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, value=prefs.temperature, singleStep=0.1)
        self.device = QComboBox()
        for value, label in (("auto", tr("The GPU when there is one")), ("cpu", tr("The CPU only (keeps the GPU free)"))):
            self.device.addItem(label, value)
        self.device.setCurrentIndex(self.device.findData(prefs.device))
        # 0 = never: the spin box shows "Never" there
        self.idle_unload = QSpinBox(minimum=0, maximum=24 * 60, value=prefs.idle_unload_minutes, singleStep=5,
                                    suffix=tr(" min"), specialValueText=tr("Never"))
        self.idle_unload.setToolTip(tr(IDLE_UNLOAD_TIP))
        self.chat_send_key = QComboBox()
        for value, label in (("enter", tr("Enter (Shift+Enter for a new line)")),
                             ("ctrl_enter", tr("Ctrl+Enter (Enter for a new line)"))):
            self.chat_send_key.addItem(label, value)
        self.chat_send_key.setCurrentIndex(self.chat_send_key.findData(prefs.chat_send_key))
        form.addRow(tr("Language (after restart)"), self.language)
        form.addRow(tr("Translate into"), self.translate_target)
        form.addRow(tr("Answer length (tokens)"), self.max_tokens)
        form.addRow(tr("Temperature"), self.temperature)
        form.addRow(tr("Run local models on"), self.device)
        form.addRow(tr("Unload the model when unused for"), self.idle_unload)
        form.addRow(tr("Send chat messages with"), self.chat_send_key)
        return page

    def _translate_target_value(self) -> str:
        """The stored value of the chosen entry, or the language the user typed in."""
        text = self.translate_target.currentText().strip()
        if not text:  # a cleared box: the automatic choice it started from, not an error about a field
            return "auto"
        index = self.translate_target.findText(text)
        return self.translate_target.itemData(index) if index >= 0 else text

    def _binding_rows(self) -> list[BindingRow]:
        rows = [(a.id, a.label(current_language()), a.hotkey, a.mode)
                for a in self._builtin_actions + self.actions_page.actions]
        rows.append((OPEN_CHAT_ID, tr("Open chat"), DEFAULT_OPEN_CHAT_HOTKEY, None))
        return rows

    def _fill_hotkeys(self) -> None:
        active, failures = self._hotkey_status()
        prefs = self.store.prefs
        self.hotkeys_page.fill(prefs.hotkeys, prefs.action_modes, active, failures)

    def collect(self) -> tuple[dict, list[Action]]:
        """The edited values as a preferences change set, with an edited Local API key under
        KEY_CHANGE; raises QwenTrayError naming a bad field."""
        hotkeys, modes = self.hotkeys_page.values()
        changes = dict(language=self.language.currentData(),
                       translate_target=self._translate_target_value(),
                       max_tokens=self.max_tokens.value(), temperature=round(self.temperature.value(), 2),
                       device=self.device.currentData(),
                       idle_unload_minutes=self.idle_unload.value(),
                       chat_send_key=self.chat_send_key.currentData(),
                       copy_shortcuts=self.hotkeys_page.copy_rules(),
                       hotkeys=hotkeys, action_modes=modes, **self.local_api_page.values(),
                       **self.system_page.values())
        edited_key = self.local_api_page.edited_key()
        if edited_key is not None:  # kept in the keyring by the tray, not a preference
            changes[KEY_CHANGE] = edited_key
        if self.models_page.user != self._models_shown:  # only this dialog's edits, onto the file as it is now
            changes["models"] = rebase_models(self.store.refresh().models, self._models_shown, self.models_page.user)
        return changes, list(self.actions_page.actions)

    def apply(self) -> bool:
        if self.models_page.removal.running:
            self.error.setText(tr("Wait until {name} is removed, then save", name=self.models_page.removal.name))
            return False
        if not self._commit_action_edit():
            return False
        try:
            changes, actions = self.collect()
            self._on_apply(changes, actions)
            self._models_shown = list(self.models_page.user)
            self.local_api_page.key_applied()
            self.system_page.apply_autostart()
        except QwenTrayError as e:
            self.error.setText(str(e))
            return False
        self.error.clear()
        self._fill_hotkeys()  # show what the OS accepted this time
        return True

    def _commit_action_edit(self) -> bool:
        """The action being edited is saved with the rest; when it is invalid the dialog stays
        open on the Actions tab, saying which field (nothing else is applied)."""
        try:
            self.actions_page.commit_edit()
        except QwenTrayError as e:
            self.tabs.setCurrentWidget(self.actions_page)
            self.error.setText(str(e))
            return False
        return True

    def _model_removed(self, name: str) -> None:
        """The registry on disk no longer has ``name``: not an edit of this dialog any more, so
        OK neither removes it again nor adds it back."""
        self._models_shown = [m for m in self._models_shown if m.name != name]

    def _removal_running(self, running: bool) -> None:
        # Saving the registry while a removal writes it could put the removed entry back.
        for button in self._save_buttons:
            button.setEnabled(not running)

    def _ok(self) -> None:
        if self.apply():
            self.accept()


def _models_tab(catalog: QWidget | None, models: QWidget) -> QWidget:
    """Models: get one from the catalog (above), the configured ones (below)."""
    if catalog is None:
        return models
    tab = QWidget()
    layout = QVBoxLayout(tab)
    for title, page, stretch in ((tr("Get a model"), catalog, 3), (tr("Your models"), models, 2)):
        box = QGroupBox(title)
        QVBoxLayout(box).addWidget(page)
        layout.addWidget(box, stretch)
    return tab
