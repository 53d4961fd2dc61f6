"""Chat history on disk: one JSON file per conversation under ``<data>/chats/``.

One file each keeps a save small and atomic; a file that does not parse is moved aside
with a notice and the rest of the history still loads (the settings' file policy,
app/settings/jsonfile.py; a file that cannot be read is left as it is).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.paths import data_dir
from app.settings.jsonfile import CORRUPT, MISSING, UNREADABLE, keep_aside, os_reason, read_json, write_json
from app.settings.notices import Notice

ROLES = ("system", "user", "assistant")
TITLE_CHARS = 60


class CorruptFileError(ValueError):
    """A conversation file that parses but is not a conversation."""


@dataclass
class ChatMessage:
    role: str
    content: str
    tokens_per_second: float = 0.0  # assistant messages: decode speed shown under the answer

    def __post_init__(self) -> None:
        if self.role not in ROLES or not isinstance(self.content, str):
            raise CorruptFileError(f"chat message has role {self.role!r}; expected one of {', '.join(ROLES)}")


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[ChatMessage] = field(default_factory=list)

    def add(self, role: str, content: str, tokens_per_second: float = 0.0) -> ChatMessage:
        message = ChatMessage(role, content, tokens_per_second)
        self.messages.append(message)
        if not self.title and role == "user":
            first_line = content.strip().splitlines()[0] if content.strip() else ""
            self.title = first_line[:TITLE_CHARS]
        self.updated = time.time()
        return message

    def as_messages(self) -> list[dict[str, str]]:
        """The conversation in the engine's message format."""
        return [{"role": m.role, "content": m.content} for m in self.messages]

    @classmethod
    def from_dict(cls, data: object) -> Conversation:
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            raise CorruptFileError("a conversation must be an object with a 'messages' list")
        try:
            messages = [ChatMessage(**m) for m in data["messages"]]
            return cls(id=str(data["id"]), title=str(data.get("title", "")), created=float(data["created"]),
                       updated=float(data["updated"]), messages=messages)
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptFileError(f"conversation field is missing or wrong: {e}") from e


class ChatHistory:
    def __init__(self, folder: Path | None = None):
        self.folder = folder or data_dir() / "chats"

    def _path(self, conversation_id: str) -> Path:
        return self.folder / f"{conversation_id}.json"

    def save(self, conversation: Conversation) -> None:
        if conversation.messages:  # an empty "new chat" is not worth a file
            write_json(self._path(conversation.id), asdict(conversation))

    def delete(self, conversation_id: str) -> None:
        self._path(conversation_id).unlink(missing_ok=True)

    def load_all(self) -> tuple[list[Conversation], list[Notice]]:
        """Every saved conversation, newest first, plus notices for files that were broken."""
        conversations, notices = [], []
        if not self.folder.is_dir():
            return [], []
        for path in sorted(self.folder.glob("*.json")):
            if ".corrupt-" in path.name:
                continue
            read = read_json(path)
            if read.state == MISSING:
                continue  # deleted since the listing
            if read.state == UNREADABLE:
                notices.append(Notice("A chat history file cannot be read and is left as it is: {file} ({error})",
                                      {"file": str(path), "error": read.problem}))
                continue
            try:
                if read.state == CORRUPT:
                    raise CorruptFileError(read.problem)
                conversations.append(Conversation.from_dict(read.data))
            except CorruptFileError as e:
                notices.append(_moved_aside(path, str(e)))
        conversations.sort(key=lambda c: c.updated, reverse=True)
        return conversations, notices


def _moved_aside(path: Path, error: str) -> Notice:
    try:
        backup = keep_aside(path)
    except OSError as e:
        return Notice("A chat history file was unreadable and could not be moved aside: {file} ({error})",
                      {"file": str(path), "error": f"{error}; {os_reason(e)}"})
    return Notice("A chat history file was unreadable and has been moved to {backup} ({error})",
                  {"backup": str(backup), "error": error})
