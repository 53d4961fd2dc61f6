"""Settings → Hotkeys: each action and the keys that run it, captured by pressing them, with
whether the system registered them in words; and the copy/paste keys of applications
(terminals get Ctrl+Shift+C/V on their own; any application can be set here)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QKeySequenceEdit, QLabel,
                               QLineEdit, QPushButton, QScrollArea, QVBoxLayout, QWidget)

from app.errors import QwenTrayError
from app.settings.actions import MODES
from app.ui.i18n import notice_text, tr
from app.settings.keys import HotkeyError, normalize_hotkey
from app.settings.keys import COPY_STYLES as STYLES

# (binding id, label, default hotkey, default mode or None for "Open chat")
BindingRow = tuple[str, str, str, "str | None"]
# Qt's portable key names that our hotkey names spell differently.
_QT_KEY_NAMES = {"PgUp": "PageUp", "PgDown": "PageDown", "Ins": "Insert", "Del": "Delete", "Return": "Enter"}


def _modifier_names(platform: str) -> dict[str, str]:
    """Qt's portable modifier name -> ours. On macOS Qt calls ⌘ "Ctrl" and the Control key "Meta"."""
    if platform == "darwin":
        return {"Ctrl": "Super", "Meta": "Ctrl", "Alt": "Alt", "Shift": "Shift"}
    return {"Ctrl": "Ctrl", "Meta": "Super", "Alt": "Alt", "Shift": "Shift"}


def hotkey_text(sequence: QKeySequence, platform: str = sys.platform) -> str:
    """A pressed combination in our spelling ("Ctrl+Alt+S"); "" for none."""
    if sequence.isEmpty():
        return ""
    *mods, key = QKeySequence(sequence[0]).toString(QKeySequence.PortableText).split("+")
    names = _modifier_names(platform)
    return "+".join([*(names.get(m, m) for m in mods), _QT_KEY_NAMES.get(key, key)])


def key_sequence(hotkey: str, platform: str = sys.platform) -> QKeySequence:
    """The QKeySequence showing ``hotkey`` ("Ctrl+Alt+S"); empty for ""."""
    if not hotkey:
        return QKeySequence()
    qt_names = {ours: qt for qt, ours in _modifier_names(platform).items()}
    qt_keys = {ours: qt for qt, ours in _QT_KEY_NAMES.items()}
    *mods, key = hotkey.split("+")
    return QKeySequence("+".join([*(qt_names.get(m, m) for m in mods), qt_keys.get(key, key)]),
                        QKeySequence.PortableText)


def mode_label(mode: str) -> str:
    """How an action answers, as the lists show it."""
    return {"popup": tr("Answer in a popup"), "replace": tr("Replace the selection")}[mode]


def style_label(style: str) -> str:
    return {"standard": tr("Ctrl+C / Ctrl+V (most applications)"),
            "ctrl_shift": tr("Ctrl+Shift+C / Ctrl+Shift+V (terminals)"),
            "ctrl_insert": tr("Ctrl+Insert / Shift+Insert (Windows console)"),
            "none": tr("No keys: use what is already selected")}[style]


def status_words(binding_id: str, active: dict[str, str], failures: dict[str, str]) -> str:
    if binding_id in failures:
        return tr("Not registered: {reason}", reason=failures[binding_id])
    return tr("Registered: works in every application") if binding_id in active else tr("Off: no hotkey")


class HotkeyField(QWidget):
    """Press the combination to set it; the clear button (or Backspace alone) switches it off.
    ``recording`` says when the field takes keys (it has the focus), so global grabs can pause."""

    recording = Signal(bool)

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.edit = QKeySequenceEdit()
        self.edit.installEventFilter(self)
        self.edit.setMaximumSequenceLength(1)
        self.edit.setClearButtonEnabled(True)
        self.edit.setToolTip(tr("Click, then press the keys"))
        self.set_text(text)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.edit, 1)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if watched is self.edit and event.type() in (QEvent.FocusIn, QEvent.FocusOut):
            self.recording.emit(event.type() == QEvent.FocusIn)
        return False

    def set_text(self, text: str) -> None:
        self.edit.setKeySequence(key_sequence(text))

    def text(self) -> str:
        return hotkey_text(self.edit.keySequence())


class HotkeysPage(QWidget):
    recording = Signal(bool)  # a hotkey field took (True) or lost (False) the keyboard

    def __init__(self, bindings: Callable[[], list[BindingRow]], parent: QWidget | None = None):
        super().__init__(parent)
        self._bindings = bindings
        self.fields: dict[str, HotkeyField] = {}
        self.modes: dict[str, QComboBox] = {}
        self.statuses: dict[str, QLabel] = {}
        self._shown: dict[str, tuple[str, str | None]] = {}  # what each row showed when filled
        self.form_box = QWidget()
        self.form = QFormLayout(self.form_box)
        scroll = QScrollArea(widgetResizable=True)
        scroll.setWidget(self.form_box)
        layout = QVBoxLayout(self)
        layout.addWidget(scroll, 1)
        layout.addWidget(self._copy_keys_box())

    # -- hotkeys ---------------------------------------------------------------------------------
    def fill(self, hotkeys: dict[str, str], modes: dict[str, str], active: dict[str, str],
             failures: dict[str, str]) -> None:
        """Rows for every binding; unsaved edits survive (an action was added meanwhile)."""
        edited = {b: v for b, v in self._row_values().items() if v != self._shown.get(b)}
        while self.form.rowCount():
            self.form.removeRow(0)
        self.fields, self.modes, self.statuses, self._shown = {}, {}, {}, {}
        for binding_id, label, default_hotkey, default_mode in self._bindings():
            text, mode = edited.get(binding_id, (hotkeys.get(binding_id, normalize_hotkey(default_hotkey)),
                                                 modes.get(binding_id, default_mode) if default_mode else None))
            self.form.addRow(label, self._row(binding_id, text, mode, status_words(binding_id, active, failures)))
            self._shown[binding_id] = self._row_values()[binding_id]

    def _row(self, binding_id: str, text: str, mode: str | None, status: str) -> QWidget:
        field = HotkeyField(text)
        field.recording.connect(self.recording)
        self.fields[binding_id] = field
        line = QHBoxLayout()
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(field, 1)
        if mode is not None:
            box = QComboBox()
            for m in MODES:
                box.addItem(mode_label(m), m)
            box.setCurrentIndex(MODES.index(mode))
            box.setToolTip(tr("Answer"))
            self.modes[binding_id] = box
            line.addWidget(box)
        label = QLabel(status)
        label.setWordWrap(True)
        self.statuses[binding_id] = label
        field.edit.keySequenceChanged.connect(lambda _seq, b=binding_id: self._check(b))
        row = QWidget()
        column = QVBoxLayout(row)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(line)
        column.addWidget(label)
        return row

    def _check(self, binding_id: str) -> None:
        """Say at once when a pressed combination cannot be a hotkey."""
        try:
            normalize_hotkey(self.fields[binding_id].text())
        except HotkeyError as e:
            self.statuses[binding_id].setText(notice_text(e.notice))
            return
        self.statuses[binding_id].setText(tr("Changed: applied with OK or Apply"))

    def _row_values(self) -> dict[str, tuple[str, str | None]]:
        return {b: (f.text(), self.modes[b].currentData() if b in self.modes else None)
                for b, f in self.fields.items()}

    def values(self) -> tuple[dict[str, str], dict[str, str]]:
        """(hotkey overrides, answer-mode overrides); raises QwenTrayError naming a bad hotkey."""
        hotkeys, modes = {}, {}
        for binding_id, label, default_hotkey, default_mode in self._bindings():
            text, mode = self._row_values()[binding_id]
            try:
                text = normalize_hotkey(text)
            except HotkeyError as e:
                raise QwenTrayError(tr("{label}: {error}", label=label, error=notice_text(e.notice))) from e
            if text != normalize_hotkey(default_hotkey):
                hotkeys[binding_id] = text  # only overrides are stored; "" switches a default off
            if mode is not None and mode != default_mode:
                modes[binding_id] = mode
        return hotkeys, modes

    # -- copy/paste keys per application ------------------------------------------------------------
    def _copy_keys_box(self) -> QGroupBox:
        box = QGroupBox(tr("Copy and paste keys per application"))
        naming = tr("Name it by window class (X11 WM_CLASS, e.g. xterm) or program (e.g. putty.exe).")
        hint = QLabel(tr("Terminals get Ctrl+Shift+C / Ctrl+Shift+V on their own, never Ctrl+C.") + " " + naming)
        hint.setWordWrap(True)
        self.copy_rows = QVBoxLayout()
        add = QPushButton(tr("Add application"))
        add.clicked.connect(lambda: self.add_copy_rule("", "ctrl_shift"))
        layout = QVBoxLayout(box)
        layout.addWidget(hint)
        layout.addLayout(self.copy_rows)
        layout.addWidget(add, 0, Qt.AlignLeft)
        return box

    def set_copy_rules(self, rules: dict[str, str]) -> None:
        while self.copy_rows.count():
            widget = self.copy_rows.takeAt(0).widget()
            widget.deleteLater()
        for app_name, style in rules.items():
            self.add_copy_rule(app_name, style)

    def add_copy_rule(self, app_name: str, style: str) -> None:
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        name = QLineEdit(app_name)
        name.setPlaceholderText(tr("Application"))
        keys = QComboBox()
        for value in STYLES:
            keys.addItem(style_label(value), value)
        keys.setCurrentIndex(STYLES.index(style))
        remove = QPushButton(tr("Remove"))
        remove.clicked.connect(lambda: (self.copy_rows.removeWidget(row), row.deleteLater()))
        line.addWidget(name, 1)
        line.addWidget(keys)
        line.addWidget(remove)
        self.copy_rows.addWidget(row)

    def copy_rules(self) -> dict[str, str]:
        rules = {}
        for i in range(self.copy_rows.count()):
            row = self.copy_rows.itemAt(i).widget()
            name, keys = row.findChild(QLineEdit), row.findChild(QComboBox)
            if name.text().strip():
                rules[name.text().strip().lower()] = keys.currentData()
        return rules
