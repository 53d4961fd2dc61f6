"""Settings pages for the user's own actions and model entries."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QFileDialog, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QListWidget,
                               QListWidgetItem, QPlainTextEdit, QPushButton, QSizePolicy, QSpinBox, QVBoxLayout,
                               QWidget)

from app.engine.cuda.fit import FLOAT16_FOLDER, folder_weights, model_fit
from app.errors import QwenTrayError
from app.hub.gguf import ImportGgufJob
from app.hub.job import GotModel
from app.model_import import check_model_folder
from app.model_removal import Removal
from app.settings.actions import MODES, Action
from app.settings.keys import HotkeyError, normalize_hotkey
from app.settings.models import ModelEntry, check_model_name
from app.ui.actions import new_action_id
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.controllers.model_removal import ModelRemoval, removal_summary
from app.ui.i18n import notice_text, tr
from app.ui.widgets.hotkeys_page import HotkeyField, mode_label
from app.ui.widgets.remove_model_dialog import RemoveModelDialog
from app.ui.widgets.system_page import key_storage_text


class ActionsPage(QWidget):
    """Add, edit and remove the user's own actions (name, prompt with {text}, hotkey, mode)."""

    changed = Signal()

    def __init__(self, user_actions: list[Action], builtin_ids: set[str], parent: QWidget | None = None):
        super().__init__(parent)
        self.actions = list(user_actions)
        self._builtin_ids = builtin_ids
        self.list = QListWidget()
        self.list.currentRowChanged.connect(self._show)
        self.name = QLineEdit()
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText(tr("Prompt; {text} is replaced by the selected text"))
        self.hotkey = HotkeyField("")  # captured by pressing it
        self.mode = QComboBox()
        for mode in MODES:
            self.mode.addItem(mode_label(mode), mode)
        # Where global hotkeys cannot be grabbed (Wayland) the desktop's own shortcut runs this command.
        self.command = QLabel(tr("(once the action is saved)"), textInteractionFlags=Qt.TextSelectableByMouse)
        self.command.setToolTip(tr("Bind this command to keys in the desktop's shortcut settings where "
                                   "Qwen Tray's hotkeys do not work (Wayland)"))
        self.error = QLabel(wordWrap=True)
        self.error.setStyleSheet("color: #b91c1c")
        self.error.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # wraps, never widens the dialog
        add, save, remove = QPushButton(tr("New action")), QPushButton(tr("Save action")), QPushButton(tr("Remove"))
        add.clicked.connect(self._new)
        save.clicked.connect(self.save_current)
        remove.clicked.connect(self._remove)
        form = QFormLayout()
        form.addRow(tr("Name"), self.name)
        form.addRow(tr("Prompt"), self.prompt)
        form.addRow(tr("Hotkey"), self.hotkey)
        form.addRow(tr("Answer"), self.mode)
        form.addRow(tr("Command"), self.command)
        buttons = QHBoxLayout()
        for b in (add, save, remove):
            buttons.addWidget(b)
        right = QVBoxLayout()
        right.addLayout(form)
        right.addWidget(self.error)
        right.addLayout(buttons)
        layout = QHBoxLayout(self)
        layout.addWidget(self.list, 1)
        layout.addLayout(right, 2)
        self._refresh()
        self._mark_unchanged()

    def _refresh(self) -> None:
        self.list.clear()
        for a in self.actions:
            self.list.addItem(QListWidgetItem(a.name))

    def _form(self) -> tuple[str, str, str, str]:
        return self.name.text(), self.prompt.toPlainText(), self.hotkey.text(), self.mode.currentData()

    def _mark_unchanged(self) -> None:
        """The form as shown (an action, or a blank new one): what an unsaved edit differs from."""
        self._shown = self._form()

    def commit_edit(self) -> None:
        """OK/Apply: an edit in the form not yet saved with "Save action" is saved now (a user who
        typed an action and pressed OK means to keep it). Raises QwenTrayError naming the bad field."""
        if self._form() == self._shown or self.save_current():
            return
        field, label = self._bad_field()
        field.setFocus(Qt.OtherFocusReason)
        raise QwenTrayError(tr("Actions: the action being edited is not saved ({field}): {error}",
                               field=label, error=self.error.text()))

    def _bad_field(self) -> tuple[QWidget, str]:
        """The form field an invalid action fails on, and its label (the checks of Action, in order)."""
        if not self.name.text().strip():
            return self.name, tr("Name")
        if "{text}" not in self.prompt.toPlainText():
            return self.prompt, tr("Prompt")
        return self.hotkey.edit, tr("Hotkey")

    def _show(self, row: int) -> None:
        if 0 <= row < len(self.actions):
            a = self.actions[row]
            self.name.setText(a.name)
            self.prompt.setPlainText(a.prompt)
            self.hotkey.set_text(a.hotkey)
            self.mode.setCurrentIndex(MODES.index(a.mode))
            self.command.setText(f"qwen-tray action {a.id}")
            self.error.clear()
            self._mark_unchanged()

    def _new(self) -> None:
        self.list.clearSelection()
        self.list.setCurrentRow(-1)
        self.name.clear()
        self.prompt.setPlainText("{text}")
        self.hotkey.set_text("")
        self.command.setText(tr("(once the action is saved)"))
        self.error.clear()
        self._mark_unchanged()  # a blank new action is no edit until something is typed

    def save_current(self) -> bool:
        """Validate the form into an action (new or the selected one); shows the error and returns False."""
        row = self.list.currentRow()
        taken = self._builtin_ids | {a.id for i, a in enumerate(self.actions) if i != row}
        problem = self._form_problem()
        if problem:  # in the user's words and language (Action's own checks name the settings-file fields)
            self.error.setText(problem)
            return False
        try:
            action = Action(
                id=self.actions[row].id if 0 <= row < len(self.actions) else new_action_id(self.name.text(), taken),
                name=self.name.text().strip(), prompt=self.prompt.toPlainText(),
                hotkey=normalize_hotkey(self.hotkey.text()), mode=self.mode.currentData())
        except HotkeyError as e:
            self.error.setText(notice_text(e.notice))
            return False
        except QwenTrayError as e:
            self.error.setText(str(e))
            return False
        if 0 <= row < len(self.actions):
            self.actions[row] = action
        else:
            self.actions.append(action)
            row = len(self.actions) - 1
        self.error.clear()
        self._refresh()
        self.list.setCurrentRow(row)
        self._mark_unchanged()
        self.changed.emit()
        return True

    def _form_problem(self) -> str | None:
        if not self.name.text().strip():
            return tr("Give the action a name.")
        if "{text}" not in self.prompt.toPlainText():
            return tr("The prompt must contain {text}, where the selected text goes.")
        return None

    def _remove(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self.actions):
            del self.actions[row]
            self._refresh()
            self._new()  # the removed action's values left in the form would be saved again on OK
            self.changed.emit()


class ModelsPage(QWidget):
    """The configured models; the user adds local folders and remote OpenAI-compatible endpoints.

    Adding is an edit the dialog saves; removing a registered model happens when the user
    confirms it (its files may be deleted: no undo), on ``removal``'s worker thread, and
    ``removed`` tells the dialog it is off the registry already."""

    changed = Signal()
    removed = Signal(str)  # a registered model was removed from the registry on disk

    def __init__(self, builtin: list[ModelEntry], user: list[ModelEntry], removal: ModelRemoval,
                 parent: QWidget | None = None, jobs: ModelJobs | None = None):
        super().__init__(parent)
        self._builtin, self.user = builtin, list(user)
        self.jobs = jobs  # GGUF imports run as model jobs; None: converted on first load (float16)
        self.removal = removal
        self.confirm: RemoveModelDialog | None = None  # the open "Remove NAME?" question
        self._confirmed: tuple[str, str] | None = None  # an fp16 folder the user adds despite the warning
        self.list = QListWidget()
        self.name, self.path = QLineEdit(), QLineEdit()
        self.base_url, self.api_key, self.model = QLineEdit(), QLineEdit(), QLineEdit()
        self.api_key.setEchoMode(QLineEdit.Password)
        self.api_key.setToolTip(key_storage_text())  # the system keyring, or why it is plain text
        self.base_url.setPlaceholderText("https://api.example.com/v1")
        self.max_context = QSpinBox(minimum=256, maximum=1_048_576, value=32768, singleStep=1024)
        self.kind = QComboBox()
        self.kind.addItem(tr("Local folder"), "local")
        self.kind.addItem(tr("GGUF file (converted once)"), "gguf")
        self.recipe = QComboBox()
        for label, recipe in ((tr("w4: fits a 4 GB GPU"), "w4"), (tr("mixed: a 7B on a 4 GB GPU"), "mixed"),
                              (tr("float16: not quantized"), "")):
            self.recipe.addItem(label, recipe)
        self.kind.addItem(tr("Remote (OpenAI-compatible)"), "remote")
        self.kind.currentIndexChanged.connect(self._kind_changed)
        browse = QPushButton(tr("Browse…"))
        browse.clicked.connect(self._browse)
        path_row = QHBoxLayout()
        path_row.addWidget(self.path, 1)
        path_row.addWidget(browse)
        self.form = QFormLayout()
        self.form.addRow(tr("Kind"), self.kind)
        self.form.addRow(tr("Name"), self.name)
        self.form.addRow(tr("Folder / file"), path_row)
        self.form.addRow(tr("Quantize GGUF to"), self.recipe)
        self.form.addRow(tr("Base URL"), self.base_url)
        self.form.addRow(tr("API key"), self.api_key)
        self.form.addRow(tr("Model id"), self.model)
        self.form.addRow(tr("Context (tokens)"), self.max_context)
        self.error = QLabel(wordWrap=True)
        self.error.setStyleSheet("color: #b91c1c")
        self.status = QLabel(wordWrap=True)  # the outcome of the last removal
        add, self.remove_button = QPushButton(tr("Add model")), QPushButton(tr("Remove"))
        add.clicked.connect(self.add_from_form)
        self.remove_button.clicked.connect(self.ask_to_remove)
        buttons = QHBoxLayout()
        buttons.addWidget(add)
        buttons.addWidget(self.remove_button)
        right = QVBoxLayout()
        right.addLayout(self.form)
        right.addWidget(self.error)
        right.addWidget(self.status)
        right.addLayout(buttons)
        layout = QHBoxLayout(self)
        layout.addWidget(self.list, 1)
        layout.addLayout(right, 2)
        self._kind_changed()
        self._refresh()
        if jobs is not None:
            jobs.finished.connect(self._registered)
        removal.runningChanged.connect(self._removal_running)
        removal.finished.connect(self._removal_done)
        removal.failed.connect(self._removal_failed)
        self._removal_running(removal.running)

    def _refresh(self) -> None:
        self.list.clear()
        for entry in self._builtin + self.user:
            item = QListWidgetItem(entry.name)
            item.setData(Qt.UserRole, entry.name)
            if entry in self._builtin:
                item.setFlags(item.flags() & ~Qt.ItemIsSelectable)
            self.list.addItem(item)

    def _kind_changed(self) -> None:
        remote = self.kind.currentData() == "remote"
        for widget in (self.base_url, self.api_key, self.model, self.max_context):
            widget.setEnabled(remote)
        self.path.setEnabled(not remote)
        self.recipe.setEnabled(self.kind.currentData() == "gguf" and self.jobs is not None)

    def _browse(self) -> None:
        if self.kind.currentData() == "gguf":
            path, _filter = QFileDialog.getOpenFileName(self, tr("GGUF model file"), "", "GGUF (*.gguf)")
        else:
            path = QFileDialog.getExistingDirectory(self, tr("Model folder"))
        if path:
            self.path.setText(path)

    def add_from_form(self) -> bool:
        names = {e.name for e in self._builtin + self.user}
        try:
            if self.name.text().strip() in names:
                raise QwenTrayError(tr("a model named {name} already exists", name=self.name.text().strip()))
            entry = ModelEntry(name=check_model_name(self.name.text()), kind=self.kind.currentData(),
                               path=self.path.text().strip(), base_url=self.base_url.text().strip(),
                               api_key=self.api_key.text().strip(), model=self.model.text().strip(),
                               max_context=self.max_context.value())
            if entry.kind == "gguf" and self.jobs is not None:
                return self._import_gguf(entry)
            if entry.kind == "local":
                _check_folder(Path(entry.path).expanduser())
            warning = self._float16_warning(entry)
        except QwenTrayError as e:
            self.error.setText(str(e))
            return False
        if warning:
            self.error.setText(warning)
            return False
        self.user.append(entry)
        self.error.clear()
        self._refresh()
        self.changed.emit()
        return True

    def _import_gguf(self, entry: ModelEntry) -> bool:
        """Convert (and quantize) the GGUF as a model job; it is registered when done."""
        machine = self.jobs.machine()
        job = ImportGgufJob(Path(entry.path), entry.name, recipe=self.recipe.currentData() or None,
                            machine=machine, device=None if machine and machine.gpu else "cpu")
        if not self.jobs.start(job, entry.name):
            raise QwenTrayError(tr("Another model is being prepared; wait for it or cancel it"))
        self.error.setText(tr("Importing {name}; it is added when ready", name=entry.name))
        return True

    def _float16_warning(self, entry: ModelEntry) -> str:
        """Say so before adding a float16 folder that will not fit the GPU (once: Add again adds it)."""
        machine = self.jobs.machine() if self.jobs is not None else None
        folder = Path(entry.path).expanduser()
        if entry.kind != "local" or machine is None or machine.gpu is None or not (folder / "config.json").is_file():
            return ""
        spec, weights, kind = folder_weights(folder)
        fit = model_fit(spec, weights, quantized=kind != FLOAT16_FOLDER, machine=machine, label=entry.name)
        if fit.on_gpu or self._confirmed == (entry.name, entry.path):
            return ""
        self._confirmed = (entry.name, entry.path)
        if kind == FLOAT16_FOLDER:
            return tr(
                "{name} is not quantized and does not fit this GPU ({verdict}); quantize it, or click Add model again",
                name=entry.name, verdict=fit.text)
        return tr("{name} does not fit this GPU ({verdict}); click Add model again to add it anyway",
                  name=entry.name, verdict=fit.text)

    def _registered(self, got: GotModel, _activate: bool) -> None:
        """A model job registered a model: list it, so Apply keeps it."""
        if got.name not in {e.name for e in self._builtin + self.user}:
            self.user.append(ModelEntry(name=got.name, kind="local", path=str(got.path)))
            self._refresh()

    def ask_to_remove(self) -> None:
        """Remove: an entry added in this dialog is dropped (nothing was saved); a registered one
        after the user confirms what will happen to its files."""
        item = self.list.currentItem()
        if item is None or self.removal.running:
            return
        name = item.data(Qt.UserRole)
        plan = self.removal.plan(name)
        if plan is None:  # not registered (yet, or any more): only this dialog lists it
            self._forget(name)
            self.changed.emit()
            return
        self.confirm = dialog = RemoveModelDialog(plan, self.removal.in_use(name), parent=self)
        dialog.accepted.connect(lambda: self.removal.start(name, dialog.keeps_files))
        dialog.open()

    def _forget(self, name: str) -> None:
        self.user = [e for e in self.user if e.name != name]
        self._refresh()

    def _removal_running(self, running: bool) -> None:
        self.remove_button.setEnabled(not running)
        if running:
            self.error.clear()
            self.status.setText(tr("Removing {name}…", name=self.removal.name))

    def _removal_done(self, removal: Removal, _in_use: bool) -> None:
        self._forget(removal.plan.entry.name)
        self.status.setText(removal_summary(removal))
        self.removed.emit(removal.plan.entry.name)

    def _removal_failed(self, message: str) -> None:
        self.status.clear()
        self.error.setText(message)


def _check_folder(folder: Path) -> None:
    """Refuse, as `models add` does, a folder no model can be loaded from: said now, not at the
    first switch to it (the commonest problems in the UI's language, the rest in the loader's words)."""
    if not folder.is_dir():
        raise QwenTrayError(tr("{path}: no such folder", path=str(folder)))
    if not (folder / "config.json").is_file() and not (folder / "manifest.json").is_file():
        raise QwenTrayError(tr("{path}: not a model folder (no config.json or manifest.json)", path=str(folder)))
    check_model_folder(folder)
