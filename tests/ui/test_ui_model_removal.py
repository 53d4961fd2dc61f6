"""Settings → Models → Remove, offscreen with real folders: asks first and says what will happen,
deletes a folder the app made (showing the disk it freed) the way `qwen-tray models remove`
does, keeps the user's own folder and, when asked, the files; Cancel changes nothing; a model
the tray has loaded is unloaded first and the tray goes on with the default model; OK after a
removal does not put the entry back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QCheckBox, QDialogButtonBox, QStyle, QStyleOptionButton
from ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

from app.progress import format_bytes
from app.model_folders import model_folder_lock
from app.model_import import register_model
from app.paths import models_dir
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore
from app.ui.app import TrayApp


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def app_model(tiny_qwen_dir):
    """app_model(name): a model folder the app made (as `models get` leaves it), registered -> its folder."""

    def make(name: str) -> Path:
        folder = models_dir() / name
        shutil.copytree(tiny_qwen_dir, folder)
        register_model(name, folder)
        return folder

    return make


@pytest.fixture
def tray(qtbot):
    apps = []

    def make(opener: FakeOpener | None = None, language: str | None = None) -> TrayApp:
        app = TrayApp(opener=opener or FakeOpener(), hotkey_factory=FakeHotkeys,
                      injector=RecordingInjector(QGuiApplication.clipboard(), "some text"),
                      server_finder=lambda: (None, "no server in these tests"), language=language)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown()


def _registry() -> dict[str, str]:
    return {m.name: m.path for m in SettingsStore().load().models}


def _names(page) -> list[str]:
    return [page.list.item(i).data(Qt.UserRole) for i in range(page.list.count())]


def _click_remove(qtbot, page, name: str):
    """Select ``name`` in Your models and press Remove: the question that opens."""
    page.list.setCurrentRow(_names(page).index(name))
    qtbot.mouseClick(page.remove_button, Qt.LeftButton)
    assert page.confirm is not None and page.confirm.isVisible()
    return page.confirm


def _indicator(checkbox: QCheckBox) -> QPoint:
    """Where the box of ``checkbox`` is drawn (a click on the empty part of a wide one does nothing)."""
    option = QStyleOptionButton()
    checkbox.initStyleOption(option)
    return checkbox.style().subElementRect(QStyle.SE_CheckBoxIndicator, option, checkbox).center()


def _confirm(qtbot, app, confirm) -> None:
    with qtbot.waitSignal(app.model_removal.runningChanged, check_params_cb=lambda running: not running,
                          timeout=10000):
        qtbot.mouseClick(confirm.remove_button, Qt.LeftButton)


def _settings(app: TrayApp):
    app.open_settings()
    return app.settings_dialog, app.settings_dialog.models_page


def test_an_app_folder_is_deleted_after_asking_and_the_page_says_what_it_freed(qtbot, tray, app_model):
    first, second = app_model("first"), app_model("second")
    size = _size(first)
    app = tray()
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "first")
    assert confirm.message.text() == f"Remove first and delete its files ({format_bytes(size)}) from {first}?"
    assert confirm.keep_files.isVisibleTo(confirm) and not confirm.keep_files.isChecked()
    _confirm(qtbot, app, confirm)
    assert not first.exists() and (second / "config.json").is_file()
    assert sorted(p.name for p in models_dir().iterdir()) == ["second"]  # nothing moved aside is left
    assert list(_registry()) == ["second"] and SettingsStore().load().default_model == "second"
    line = f"Removed first: deleted {first}, {format_bytes(size)} freed; the default model is now second"
    assert page.status.text() == line and page.error.text() == ""
    assert _names(page) == ["SmolLM2-135M-Instruct", "second"]
    assert app.notices[-1] == line  # also told by the tray, should the dialog be closed by then
    assert page.remove_button.isEnabled()


def test_a_folder_the_user_added_from_elsewhere_is_only_unregistered(qtbot, tray, app_model, tiny_qwen_dir, tmp_path):
    app_model("made")
    mine = tmp_path / "my-models" / "mine"
    shutil.copytree(tiny_qwen_dir, mine)
    with SettingsStore().edit() as settings:  # `qwen-tray models add mine FOLDER`
        settings.add_model(ModelEntry(name="mine", kind="local", path=str(mine)))
    app = tray()
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "mine")
    assert confirm.message.text() == (f"Remove mine? Only its entry is removed: its folder {mine} was added from "
                                      "elsewhere and is yours, so it stays.")
    assert not confirm.keep_files.isVisibleTo(confirm)  # nothing would be deleted anyway
    _confirm(qtbot, app, confirm)
    assert _size(mine) == _size(tiny_qwen_dir) and "mine" not in _registry()
    assert page.status.text() == (f"Removed mine: its folder {mine} was added from elsewhere and is yours, so it "
                                  "stays; nothing was deleted")


def test_keep_the_files_only_unregisters(qtbot, tray, app_model):
    folder = app_model("kept")
    size = _size(folder)
    app = tray()
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "kept")
    qtbot.mouseClick(confirm.keep_files, Qt.LeftButton, pos=_indicator(confirm.keep_files))
    assert confirm.keep_files.isChecked()
    _confirm(qtbot, app, confirm)
    assert _size(folder) == size and _registry() == {}
    assert page.status.text() == (f"Removed kept: its folder {folder} stays, as you asked; nothing was deleted; "
                                  "there is no default model now")


def test_cancel_changes_nothing(qtbot, tray, app_model):
    folder = app_model("stays")
    size = _size(folder)
    app = tray()
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "stays")
    qtbot.mouseClick(confirm.findChild(QDialogButtonBox).button(QDialogButtonBox.Cancel), Qt.LeftButton)
    assert not confirm.isVisible() and not app.model_removal.running
    assert _size(folder) == size and _registry() == {"stays": str(folder)}
    assert "stays" in _names(page) and page.status.text() == ""


class FolderWitness(list):
    """A FakeOpener log that also notes whether ``folder`` still existed at each open and close."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def append(self, item) -> None:
        super().append((*item, self.folder.exists()))


def test_the_loaded_model_is_unloaded_before_its_files_go_and_the_tray_goes_on_with_the_default(
        qtbot, tray, app_model):
    big, small = app_model("big"), app_model("small")
    opener = FakeOpener()
    opener.log = FolderWitness(big)
    app = tray(opener)
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()  # the default model: big
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "big")
    assert confirm.message.text().endswith(
        "\n\nQwen Tray is using big: it is unloaded first, then the default model is loaded.")
    with qtbot.waitSignal(app.host.loaded, timeout=10000):  # the default model, once big is gone
        _confirm(qtbot, app, confirm)
    assert opener.log == [("open", "big", True), ("close", "big", True), ("open", "small", False)]
    assert not big.exists() and (small / "config.json").is_file()
    assert app.host.entry.name == "small" and app.store.prefs.active_model == "small"
    assert page.status.text().endswith("freed; the default model is now small")


def test_a_removal_that_fails_changes_nothing_and_the_tray_loads_its_model_again(qtbot, tray, app_model):
    big = app_model("big")
    app_model("small")
    opener = FakeOpener()
    app = tray(opener)
    with qtbot.waitSignal(app.host.loaded, timeout=5000):
        app.start()
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "big")
    # another qwen-tray process is working on big's folder meanwhile; the tray reloads big after
    with model_folder_lock("big"), qtbot.waitSignal(app.host.loaded, timeout=10000):
        _confirm(qtbot, app, confirm)
    assert "is being written or removed by another qwen-tray process" in page.error.text()
    assert (big / "config.json").is_file() and list(_registry()) == ["big", "small"]
    assert "big" in _names(page) and app.host.entry.name == "big"
    assert [e for e in opener.log if e[0] == "open"] == [("open", "big"), ("open", "big")]
    assert app.notices[-1].startswith("Could not remove the model: ")


def test_ok_after_a_removal_does_not_bring_the_entry_back(qtbot, tray, app_model, tmp_path, tiny_qwen_dir):
    app_model("gone")
    app_model("other")
    app = tray()
    dialog, page = _settings(app)
    page.name.setText("added here")  # an edit OK saves: a folder added in this dialog
    page.path.setText(str(_model_folder(tmp_path / "added", tiny_qwen_dir)))
    assert page.add_from_form()
    page.name.setText("added and dropped")
    page.path.setText(str(_model_folder(tmp_path / "dropped", tiny_qwen_dir)))
    assert page.add_from_form()
    page.list.setCurrentRow(_names(page).index("added and dropped"))
    qtbot.mouseClick(page.remove_button, Qt.LeftButton)  # never saved: dropped without a question
    assert page.confirm is None and "added and dropped" not in _names(page)
    _confirm(qtbot, app, _click_remove(qtbot, page, "gone"))
    qtbot.mouseClick(dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.Ok), Qt.LeftButton)
    assert not dialog.isVisible() and dialog.error.text() == ""
    assert list(_registry()) == ["other", "added here"]
    app.open_settings()  # opened again: the list is the registry
    assert _names(app.settings_dialog.models_page) == ["SmolLM2-135M-Instruct", "other", "added here"]


def test_the_question_and_the_outcome_in_chinese(qtbot, tray, app_model):
    folder = app_model("模型")
    size = _size(folder)
    app = tray(language="zh_CN")
    _dialog, page = _settings(app)
    confirm = _click_remove(qtbot, page, "模型")
    assert confirm.message.text() == f"移除 模型 并从 {folder} 删除其文件（{format_bytes(size)}）？"
    assert confirm.keep_files.text() == "保留文件"
    _confirm(qtbot, app, confirm)
    assert page.status.text() == f"已移除 模型：已删除 {folder}，释放了 {format_bytes(size)}；现在没有默认模型"


def _model_folder(folder, source):
    """A folder Settings accepts: a model's config.json (the weights are not read when adding)."""
    folder.mkdir()
    shutil.copy(source / "config.json", folder)
    return folder
