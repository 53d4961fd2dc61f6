"""The Settings dialog: general options, hotkeys (with what the OS refused), actions, models."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFormLayout, QGroupBox, QLabel,
                               QLineEdit, QSpinBox, QTableWidget, QTableWidgetItem, QTabWidget, QVBoxLayout, QWidget)

from app.errors import QwenTrayError
from app.ui.actions import MODES, OPEN_CHAT_ID, Action
from app.ui.i18n import current_language, tr
from app.ui.models import ModelEntry
from app.ui.platform.keys import normalize_hotkey
from app.ui.preferences import PreferencesStore
from app.ui.widgets.icons import app_icon
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.widgets.catalog_page import CatalogPage
from app.ui.widgets.settings_pages import ActionsPage, ModelsPage

TRANSLATE_TARGETS = ("auto", "English", "Simplified Chinese", "Traditional Chinese", "Japanese", "Korean",
                     "French", "German", "Spanish")


class SettingsDialog(QDialog):
    def __init__(self, store: PreferencesStore, builtin_actions: list[Action], user_actions: list[Action],
                 builtin_models: list[ModelEntry], user_models: list[ModelEntry],
                 hotkey_status: Callable[[], tuple[dict, dict]],
                 on_apply: Callable[[dict, list[Action]], None], parent: QWidget | None = None,
                 model_jobs: ModelJobs | None = None):
        super().__init__(parent)
        self.setWindowTitle(tr("Qwen Tray settings"))
        self.setWindowIcon(app_icon())
        self.store, self._builtin_actions = store, builtin_actions
        self._hotkey_status = hotkey_status  # () -> (active {id: hotkey}, failures {id: reason})
        self._on_apply = on_apply  # saves preferences + user actions and re-registers hotkeys
        self.tabs = QTabWidget()
        self.tabs.addTab(self._general_page(), tr("General"))
        self.hotkeys_table = QTableWidget(0, 4)
        self.hotkeys_table.setHorizontalHeaderLabels([tr("Action"), tr("Hotkey"), tr("Answer"), tr("Status")])
        self._shown: dict[str, tuple[str, str | None]] = {}  # what each row showed when filled
        self.tabs.addTab(self.hotkeys_table, tr("Hotkeys"))
        self.actions_page = ActionsPage(user_actions, {a.id for a in builtin_actions})
        self.actions_page.changed.connect(self._fill_hotkeys)
        self.tabs.addTab(self.actions_page, tr("Actions"))
        self.models_page = ModelsPage(builtin_models, user_models, jobs=model_jobs)
        self.catalog_page = CatalogPage(model_jobs, store) if model_jobs is not None else None
        self.tabs.addTab(_models_tab(self.catalog_page, self.models_page), tr("Models"))
        self.error = QLabel()
        self.error.setStyleSheet("color: #b91c1c")
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Apply | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self._ok)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.Apply).clicked.connect(self.apply)
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
        self.translate_target = QComboBox(editable=True)
        self.translate_target.addItems(TRANSLATE_TARGETS)
        self.translate_target.setCurrentText(prefs.translate_target)
        self.max_tokens = QSpinBox(minimum=16, maximum=8192, value=prefs.max_tokens, singleStep=64)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, value=prefs.temperature, singleStep=0.1)
        self.api_port = QSpinBox(minimum=1024, maximum=65535, value=prefs.local_api_port)
        self.device = QComboBox()
        for value, label in (("auto", tr("The GPU when there is one")), ("cpu", tr("The CPU only (keeps the GPU free)"))):
            self.device.addItem(label, value)
        self.device.setCurrentIndex(self.device.findData(prefs.device))
        form.addRow(tr("Language (after restart)"), self.language)
        form.addRow(tr("Translate into"), self.translate_target)
        form.addRow(tr("Answer length (tokens)"), self.max_tokens)
        form.addRow(tr("Temperature"), self.temperature)
        form.addRow(tr("Local API port"), self.api_port)
        form.addRow(tr("Run local models on"), self.device)
        return page

    def _binding_rows(self) -> list[tuple[str, str, str, str | None]]:
        """(binding id, label, default hotkey, default mode or None for open chat)."""
        rows = [(a.id, a.label(current_language()), a.hotkey, a.mode)
                for a in self._builtin_actions + self.actions_page.actions]
        from app.ui.actions import DEFAULT_OPEN_CHAT_HOTKEY

        rows.append((OPEN_CHAT_ID, tr("Open chat"), DEFAULT_OPEN_CHAT_HOTKEY, None))
        return rows

    def _table_values(self) -> dict[str, tuple[str, str | None]]:
        """Rows the user edited: binding id -> (hotkey text, mode or None)."""
        values = {}
        for r in range(self.hotkeys_table.rowCount()):
            binding_id = self.hotkeys_table.item(r, 0).data(256)
            mode_box = self.hotkeys_table.cellWidget(r, 2)
            value = (self.hotkeys_table.cellWidget(r, 1).text(), mode_box.currentData() if mode_box else None)
            if value != self._shown.get(binding_id):
                values[binding_id] = value
        return values

    def _fill_hotkeys(self) -> None:
        prefs = self.store.prefs
        active, failures = self._hotkey_status()
        edited = self._table_values()  # keep unsaved edits when the rows are rebuilt (an action was added)
        rows = self._binding_rows()
        self._shown: dict[str, tuple[str, str | None]] = {}
        self.hotkeys_table.setRowCount(len(rows))
        for r, (binding_id, label, default_hotkey, default_mode) in enumerate(rows):
            name = QTableWidgetItem(label)
            name.setData(256, binding_id)  # Qt.UserRole
            self.hotkeys_table.setItem(r, 0, name)
            hotkey_text, mode_value = edited.get(binding_id, (prefs.hotkeys.get(binding_id, default_hotkey),
                                                             prefs.action_modes.get(binding_id, default_mode)))
            self.hotkeys_table.setCellWidget(r, 1, QLineEdit(hotkey_text))
            self._shown[binding_id] = (hotkey_text, (mode_value or default_mode) if default_mode else None)
            if default_mode is not None:
                mode = QComboBox()
                for m in MODES:
                    mode.addItem(tr(m), m)
                mode.setCurrentIndex(MODES.index(mode_value or default_mode))
                self.hotkeys_table.setCellWidget(r, 2, mode)
            status = failures.get(binding_id) or (tr("registered") if binding_id in active else tr("off"))
            self.hotkeys_table.setItem(r, 3, QTableWidgetItem(status))
        self.hotkeys_table.resizeColumnsToContents()

    def collect(self) -> tuple[dict, list[Action]]:
        """The edited values as a preferences change set; raises QwenTrayError naming a bad field."""
        hotkeys, modes = {}, {}
        defaults = {b: (h, m) for b, _label, h, m in self._binding_rows()}
        for r in range(self.hotkeys_table.rowCount()):
            binding_id = self.hotkeys_table.item(r, 0).data(256)
            text = normalize_hotkey(self.hotkeys_table.cellWidget(r, 1).text())
            default_hotkey, default_mode = defaults[binding_id]
            if text != normalize_hotkey(default_hotkey):
                hotkeys[binding_id] = text  # only overrides are stored; "" switches a default off
            mode_box = self.hotkeys_table.cellWidget(r, 2)
            if mode_box is not None and mode_box.currentData() != default_mode:
                modes[binding_id] = mode_box.currentData()
        changes = dict(language=self.language.currentData(),
                       translate_target=self.translate_target.currentText().strip(),
                       max_tokens=self.max_tokens.value(), temperature=round(self.temperature.value(), 2),
                       local_api_port=self.api_port.value(), device=self.device.currentData(),
                       hotkeys=hotkeys, action_modes=modes,
                       models=self.models_page.user)
        return changes, list(self.actions_page.actions)

    def apply(self) -> bool:
        try:
            changes, actions = self.collect()
            self._on_apply(changes, actions)
        except QwenTrayError as e:
            self.error.setText(str(e))
            return False
        self.error.clear()
        self._fill_hotkeys()  # show what the OS accepted this time
        return True

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
