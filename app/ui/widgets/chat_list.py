"""The chat window's list of conversations: the saved ones and this run's, the latest active
first, in step with the history: a conversation whose file is deleted elsewhere (the History
window, with history on or off) leaves the list; one never written (history off, or the disk
refused) stays, as this run's own."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QWidget

from app.ui.history import ChatHistory, Conversation
from app.ui.i18n import tr


class ConversationList(QListWidget):
    removed = Signal(set)  # the ids of listed conversations whose files were deleted elsewhere

    def __init__(self, history: ChatHistory, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextElideMode(Qt.ElideRight)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.history = history
        self.conversations, self.notices = history.load_all()
        self._on_disk = {c.id for c in self.conversations}  # those with a file, which History may delete
        history.subscribe(self._history_changed)
        self._refresh()

    def save(self, conversation: Conversation) -> None:
        """List ``conversation`` where its latest message puts it and write it (SettingsFileError:
        not written, listed all the same)."""
        if conversation not in self.conversations:
            self.conversations.append(conversation)
        self.conversations.sort(key=lambda c: c.updated, reverse=True)
        self._refresh()
        if self.history.save(conversation):
            self._on_disk.add(conversation.id)

    def forget(self, conversation: Conversation) -> None:
        """Unlist ``conversation`` and delete its file, if it was written."""
        if conversation in self.conversations:
            self.conversations.remove(conversation)
        if conversation.id in self._on_disk:
            self._on_disk.discard(conversation.id)
            self.history.delete(conversation.id)
        self._refresh()

    def find(self, conversation_id: str) -> Conversation | None:
        """The conversation ``conversation_id``, listed or saved since the list was made (by
        another chat window); None when there is none."""
        if not any(c.id == conversation_id for c in self.conversations):
            listed = {c.id for c in self.conversations}
            saved, _notices = self.history.load_all()
            self.conversations += [c for c in saved if c.id not in listed]
            self.conversations.sort(key=lambda c: c.updated, reverse=True)
            self._on_disk |= {c.id for c in saved}
            self._refresh()
        return next((c for c in self.conversations if c.id == conversation_id), None)

    def _history_changed(self) -> None:
        kept = self.history.ids()
        gone = {c.id for c in self.conversations if c.id in self._on_disk and c.id not in kept}
        if gone:
            self.conversations = [c for c in self.conversations if c.id not in gone]
            self._on_disk -= gone
            self._refresh()
            self.removed.emit(gone)

    def _refresh(self) -> None:
        self.clear()
        for conversation in self.conversations:
            item = QListWidgetItem(conversation.title or tr("(untitled)"))
            item.setData(Qt.UserRole, conversation.id)
            self.addItem(item)
