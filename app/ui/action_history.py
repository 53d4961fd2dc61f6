"""Hotkey action results kept beside the chats: the action, the text it ran on, the answer, the
model and the time, one file each under ``<data>/action-results/`` (app/ui/history.py's policy)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from app.paths import data_dir
from app.settings.notices import Notice
from app.ui.history import CorruptFileError, HistoryFolder


@dataclass(frozen=True)
class ActionRecord:
    action: str  # the action's name as it was shown (or the popup instruction's words)
    source: str  # the text the action ran on
    answer: str
    model: str
    action_id: str = ""
    origin: str = "selection"  # where the text came from (selection_capture.ORIGINS)
    created: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def text(self) -> str:
        """Everything a search looks at."""
        return "\n".join((self.action, self.source, self.answer, self.model))

    @classmethod
    def from_dict(cls, data: object) -> ActionRecord:
        if not isinstance(data, dict):
            raise CorruptFileError("an action result must be an object")
        known = {f.name for f in fields(cls)}
        try:
            record = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as e:
            raise CorruptFileError(f"action result field is missing: {e}") from e
        texts_ok = all(isinstance(getattr(record, f.name), str) for f in fields(cls) if f.name != "created")
        if not texts_ok or isinstance(record.created, bool) or not isinstance(record.created, (int, float)):
            raise CorruptFileError("an action result field has the wrong type")
        return record


class ActionHistory(HistoryFolder[ActionRecord]):
    def __init__(self, folder: Path | None = None, enabled: Callable[[], bool] | None = None):
        super().__init__(folder or data_dir() / "action-results", ActionRecord.from_dict, enabled)

    def save(self, record: ActionRecord) -> None:
        self.write(record.id, asdict(record))

    def load_all(self) -> tuple[list[ActionRecord], list[Notice]]:
        """Every kept result, newest first, plus notices for files that were broken."""
        records, notices = super().load_all()
        records.sort(key=lambda r: r.created, reverse=True)
        return records, notices
