"""History on disk: chats (``<data>/chats/``) and hotkey action results (``<data>/action-results/``,
app/ui/action_history.py), one JSON file per conversation or result.

One file each keeps a save small and atomic (app.paths.atomic_write_text); a file that does not
parse is moved aside with a notice and the rest of the history still loads (the settings' file
policy, app/settings/jsonfile.py; a file that cannot be read is left as it is). With the
``keep_history`` preference off nothing new is written. Listeners hear of every change (the
History window, the chat window's list).

An entry's id is its file's name (the stem), whatever ``id`` the file holds: saving and deleting
build the path from the id, so an id read from inside a file ("../../config/settings", or the
same id in a copied file) must never choose which file is written or deleted.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Generic, TypeVar

from app.paths import data_dir
from app.settings.jsonfile import CORRUPT, MISSING, UNREADABLE, keep_aside, os_reason, read_json, write_json
from app.settings.notices import Notice
from app.ui.i18n import tr

ROLES = ("system", "user", "assistant")
# How an answer ended when it did not end by itself: "stopped" (Stop, another chat opened, a model
# switch, quitting) or "length" (cut off at the answer length); "" for a complete answer.
FINISHES = ("", "stopped", "length")
TITLE_CHARS = 60
T = TypeVar("T")


class CorruptFileError(ValueError):
    """A history file that parses but is not what it should hold."""


def finish_note(finish: str) -> str:
    """The note under an answer that did not end by itself (ChatMessage.finish)."""
    if finish == "stopped":
        return tr("Stopped")
    if finish == "length":
        return tr("Cut off at the answer length")
    return ""


@dataclass
class ChatMessage:
    role: str
    content: str
    tokens_per_second: float = 0.0  # assistant messages: decode speed shown under the answer
    finish: str = ""  # assistant messages: one of FINISHES

    def __post_init__(self) -> None:
        if self.role not in ROLES or not isinstance(self.content, str):
            raise CorruptFileError(f"chat message has role {self.role!r}; expected one of {', '.join(ROLES)}")
        if self.finish not in FINISHES:
            self.finish = ""  # a file edited by hand: the note under the answer goes, the text stays
        speed = self.tokens_per_second
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 <= speed < math.inf:
            # A file edited by hand ("fast", [1], NaN): the speed is only shown, so it goes and the text stays.
            self.tokens_per_second = 0.0


MESSAGE_FIELDS = {f.name for f in fields(ChatMessage)}


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[ChatMessage] = field(default_factory=list)

    def add(self, role: str, content: str, tokens_per_second: float = 0.0, finish: str = "") -> ChatMessage:
        message = ChatMessage(role, content, tokens_per_second, finish)
        self.messages.append(message)
        if not self.title and role == "user":
            first_line = content.strip().splitlines()[0] if content.strip() else ""
            self.title = first_line[:TITLE_CHARS]
        self.updated = time.time()
        return message

    def as_messages(self) -> list[dict[str, str]]:
        """The conversation in the engine's message format."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    def text(self) -> str:
        """Everything a search looks at."""
        return "\n".join([self.title, *(m.content for m in self.messages)])

    @classmethod
    def from_dict(cls, data: object) -> Conversation:
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise CorruptFileError("a conversation must be an object with a 'messages' list")
        try:
            # Fields this version does not know (a newer one wrote them) are left out, not a reason
            # to set the whole conversation aside.
            messages = [ChatMessage(**{k: v for k, v in m.items() if k in MESSAGE_FIELDS}) for m in data["messages"]]
            return cls(id=str(data["id"]), title=str(data.get("title", "")), created=float(data["created"]),
                       updated=float(data["updated"]), messages=messages)
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # (AttributeError: a message that is no object)
            raise CorruptFileError(f"conversation field is missing or wrong: {e}") from e


class HistoryFolder(Generic[T]):
    """One JSON file per entry in ``folder``; ``parse`` turns a file's data into an entry (or raises
    CorruptFileError). ``enabled`` says whether anything may be written (the keep_history preference)."""

    def __init__(self, folder: Path, parse: Callable[[object], T], enabled: Callable[[], bool] | None = None):
        self.folder = folder
        self._parse = parse
        self._enabled = enabled or (lambda: True)
        self._listeners: list[Callable[[], None]] = []

    @property
    def enabled(self) -> bool:
        return self._enabled()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """``listener()`` after every save and delete."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def _path(self, entry_id: str) -> Path:
        if not _is_plain_name(entry_id):  # a bug, not the user's doing: ids are uuids or file stems
            raise ValueError(f"history entry id {entry_id!r} is not a plain file name")
        return self.folder / f"{entry_id}.json"

    def write(self, entry_id: str, data: dict) -> bool:
        """Save one entry (atomically); False when history is off."""
        if not self.enabled:
            return False
        write_json(self._path(entry_id), data)
        self._changed()
        return True

    def delete(self, entry_id: str) -> None:
        self._path(entry_id).unlink(missing_ok=True)
        self._changed()

    def delete_all(self) -> None:
        """Every entry (the files set aside as corrupt stay: they are the user's to look at)."""
        for path in self._entry_files():
            path.unlink(missing_ok=True)
        self._changed()

    def ids(self) -> set[str]:
        """The entries on disk now (a listing, nothing read)."""
        return {path.stem for path in self._entry_files()}

    def _entry_files(self) -> Iterator[Path]:
        if self.folder.is_dir():
            yield from (p for p in sorted(self.folder.glob("*.json")) if ".corrupt-" not in p.name)

    def load_all(self) -> tuple[list[T], list[Notice]]:
        """Every saved entry, plus notices for files that were broken."""
        entries, notices = [], []
        for path in self._entry_files():
            read = read_json(path)
            if read.state == MISSING:
                continue  # deleted since the listing
            if read.state == UNREADABLE:
                notices.append(Notice("A history file cannot be read and is left as it is: {file} ({error})",
                                      {"file": str(path), "error": read.problem}))
                continue
            try:
                if read.state == CORRUPT:
                    raise CorruptFileError(read.problem)
                data = {**read.data, "id": path.stem} if isinstance(read.data, dict) else read.data
                entries.append(self._parse(data))
            except CorruptFileError as e:
                notices.append(_moved_aside(path, str(e)))
        return entries, notices


class ChatHistory(HistoryFolder[Conversation]):
    def __init__(self, folder: Path | None = None, enabled: Callable[[], bool] | None = None):
        super().__init__(folder or data_dir() / "chats", Conversation.from_dict, enabled)

    def save(self, conversation: Conversation) -> bool:
        """Write it (atomically); False when nothing was written (history is off, no messages)."""
        if not conversation.messages:  # an empty "new chat" is not worth a file
            return False
        return self.write(conversation.id, asdict(conversation))

    def load_all(self) -> tuple[list[Conversation], list[Notice]]:
        """Every saved conversation, newest first, plus notices for files that were broken."""
        conversations, notices = super().load_all()
        conversations.sort(key=lambda c: c.updated, reverse=True)
        return conversations, notices


def _is_plain_name(entry_id: str) -> bool:
    return (bool(entry_id) and entry_id not in (".", "..") and "/" not in entry_id and "\\" not in entry_id
            and "\0" not in entry_id)


def _moved_aside(path: Path, error: str) -> Notice:
    try:
        backup = keep_aside(path)
    except OSError as e:
        return Notice("A history file was unreadable and could not be moved aside: {file} ({error})",
                      {"file": str(path), "error": f"{error}; {os_reason(e)}"})
    return Notice("A history file was unreadable and has been moved to {backup} ({error})",
                  {"backup": str(backup), "error": error})
