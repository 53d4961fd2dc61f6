"""The History window: chats and hotkey action results in one list; search, open a chat, delete
one or all, export what is shown to Markdown."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem,
                               QMessageBox, QPushButton, QSplitter, QVBoxLayout, QWidget)

from app.settings.notices import Notice
from app.ui.action_history import ActionHistory
from app.ui.history import ChatHistory
from app.ui.history_export import HistoryEntry, entries, export_markdown
from app.ui.i18n import current_language, notice_text, tr
from app.ui.widgets.entry_view import EntryView
from app.ui.widgets.icons import app_icon


class HistoryWindow(QWidget):
    def __init__(self, chats: ChatHistory, results: ActionHistory, open_chat: Callable[[str], None],
                 notify: Callable[[str | Notice], None], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle(tr("Qwen Tray history"))
        self.setWindowIcon(app_icon())
        self.chats, self.results = chats, results
        self._open_chat, self._notify = open_chat, notify
        self.all: list[HistoryEntry] = []
        self.shown: list[HistoryEntry] = []
        self.confirm: QMessageBox | None = None
        self._build()
        chats.subscribe(self._changed)
        results.subscribe(self._changed)
        self.resize(860, 560)  # (filled when shown: showEvent)

    def _build(self) -> None:
        self.search = QLineEdit(placeholderText=tr("Search chats and action results"), clearButtonEnabled=True)
        self.search.textChanged.connect(self._fill)
        self.list = QListWidget()
        self.list.currentRowChanged.connect(self._show)
        self.view = EntryView()
        self.status = QLabel()
        self.open_button = QPushButton(tr("Open in chat"))
        self.open_button.clicked.connect(self.open_selected)
        self.delete_button = QPushButton(tr("Delete"))
        self.delete_button.clicked.connect(self.delete_selected)
        self.delete_all_button = QPushButton(tr("Delete all…"))
        self.delete_all_button.clicked.connect(self.ask_delete_all)
        self.export_button = QPushButton(tr("Export to Markdown…"))
        self.export_button.clicked.connect(self._choose_export_file)
        splitter = QSplitter()
        splitter.addWidget(self.list)
        splitter.addWidget(self.view)
        splitter.setSizes([320, 540])
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        for button in (self.open_button, self.delete_button, self.delete_all_button, self.export_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.search)
        layout.addWidget(splitter, 1)
        layout.addLayout(buttons)

    # -- contents ----------------------------------------------------------------------------------
    def reload(self) -> None:
        conversations, chat_notices = self.chats.load_all()
        records, result_notices = self.results.load_all()
        for notice in chat_notices + result_notices:
            self._notify(notice)  # a file set aside: where it went
        self.all = entries(conversations, records)
        self._fill()

    def _changed(self) -> None:
        if self.isVisible():
            self.reload()

    def showEvent(self, event) -> None:  # noqa: N802 (Qt)
        super().showEvent(event)
        self.reload()  # what was kept while the window was closed

    def _fill(self) -> None:
        query = self.search.text()
        selected = self.selected()
        self.shown = [e for e in self.all if e.matches(query)]
        self.list.clear()
        for entry in self.shown:
            item = QListWidgetItem(entry.title())
            item.setData(Qt.UserRole, entry.id)
            self.list.addItem(item)
        ids = [e.id for e in self.shown]
        self.list.setCurrentRow(ids.index(selected.id) if selected and selected.id in ids else (0 if ids else -1))
        self._show(self.list.currentRow())
        self._say_what_is_kept()

    def _say_what_is_kept(self) -> None:
        if not self.chats.enabled:
            self.status.setText(tr("History is off (Settings → System): nothing new is kept"))
        else:
            self.status.setText(tr("{shown} of {total} shown", shown=len(self.shown), total=len(self.all)))

    def selected(self) -> HistoryEntry | None:
        row = self.list.currentRow()
        return self.shown[row] if 0 <= row < len(self.shown) else None

    def _show(self, row: int) -> None:
        entry = self.shown[row] if 0 <= row < len(self.shown) else None
        self.view.show_entry(entry)
        self.open_button.setEnabled(entry is not None and entry.is_chat)
        self.delete_button.setEnabled(entry is not None)
        self.export_button.setEnabled(bool(self.shown))
        self.delete_all_button.setEnabled(bool(self.all))

    # -- buttons -------------------------------------------------------------------------------------
    def open_selected(self) -> None:
        entry = self.selected()
        if entry is not None and entry.is_chat:
            self._open_chat(entry.id)

    def delete_selected(self) -> None:
        entry = self.selected()
        if entry is not None:
            self._deleting(lambda: (self.chats if entry.is_chat else self.results).delete(entry.id))

    def ask_delete_all(self) -> None:
        """Everything, chats and results, after the user confirms."""
        self.confirm = QMessageBox(QMessageBox.Warning, tr("Delete all history"),
                                   tr("Delete all {n} chats and action results? This cannot be undone.",
                                      n=len(self.all)), QMessageBox.Yes | QMessageBox.Cancel, self)
        self.confirm.setDefaultButton(QMessageBox.Cancel)
        self.confirm.button(QMessageBox.Yes).clicked.connect(self.delete_all)
        self.confirm.open()

    def delete_all(self) -> None:
        self._deleting(lambda: (self.chats.delete_all(), self.results.delete_all()))

    def _deleting(self, delete: Callable[[], object]) -> None:
        try:
            delete()
        except OSError as e:
            self._notify(tr("Could not delete from the history: {error}", error=f"{e.filename}: {e.strerror or e}"))
        self.reload()

    def _choose_export_file(self) -> None:
        dialog = export_dialog(self)
        if dialog.exec() and dialog.selectedFiles():
            path = dialog.selectedFiles()[0]  # a name typed without an extension gets the Markdown one
            self.export_to(Path(path) if Path(path).suffix else Path(path).with_suffix(".md"))

    def export_to(self, path: Path) -> None:
        """What the list shows (the search applied), as Markdown."""
        try:
            export_markdown(path, self.shown)
        except OSError as e:
            self.status.setText(tr("Could not write {file}: {error}", file=str(path), error=e.strerror or str(e)))
            return
        self.status.setText(tr("Exported {n} entries to {file}", n=len(self.shown), file=str(path)))


def export_dialog(parent: QWidget) -> QFileDialog:
    """Where to export to. Qt's own dialog (where the desktop has no native one) gets its labels in
    Chinese from us: the qtbase_zh_CN.qm PySide6 ships leaves "Look in:" and "Files of type:" in English."""
    dialog = QFileDialog(parent, tr("Export to Markdown"), str(Path.home() / "qwen-tray-history.md"),
                         "Markdown (*.md)")
    dialog.setAcceptMode(QFileDialog.AcceptSave)
    if current_language() == "zh_CN":  # (a native dialog ignores these, or takes Save / Cancel)
        for label, text in ((QFileDialog.LookIn, tr("&Look in:")), (QFileDialog.FileName, tr("File &name:")),
                            (QFileDialog.FileType, tr("Files of &type:")), (QFileDialog.Accept, tr("&Save")),
                            (QFileDialog.Reject, tr("Cancel"))):
            dialog.setLabelText(label, text)
    return dialog
