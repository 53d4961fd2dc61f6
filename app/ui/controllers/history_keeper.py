"""The tray's history: the chats and the hotkey action results it keeps (unless the keep_history
preference is off), and the History window over both."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject

from app.settings.jsonfile import SettingsFileError
from app.settings.notices import Notice
from app.settings.preferences import Preferences
from app.ui.action_history import ActionHistory, ActionRecord
from app.ui.history import ChatHistory
from app.ui.i18n import tr
from app.ui.widgets.history_window import HistoryWindow


class HistoryKeeper(QObject):
    def __init__(self, prefs: Callable[[], Preferences], notify: Callable[[str | Notice], None],
                 open_conversation: Callable[[str], None], parent: QObject | None = None):
        super().__init__(parent)
        keep = lambda: prefs().keep_history  # noqa: E731 - read when each entry is written
        self.chats = ChatHistory(enabled=keep)
        self.results = ActionHistory(enabled=keep)
        self._notify, self._open_conversation = notify, open_conversation
        self.window = None

    def keep(self, record: ActionRecord) -> None:
        """An action's answer, kept beside the chats."""
        try:
            self.results.save(record)
        except SettingsFileError as e:  # a full disk, a read-only folder: the answer is still in the popup
            self._notify(tr("The action result is not kept in the history: {error}", error=str(e)))

    def open_window(self) -> None:
        if self.window is None:
            self.window = HistoryWindow(self.chats, self.results, self._open_conversation, self._notify)
        self.window.show()
        self.window.raise_()
        self.window.activateWindow()
