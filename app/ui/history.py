"""Chat history on disk: one JSON file per conversation under ``<data>/chats/``.

One file each keeps a save small and atomic; a file that does not parse is moved aside
with a notice and the rest of the history still loads.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.ui.i18n import Notice
from app.ui.jsonfile import CorruptFileError, back_up_corrupt, read_json, write_json_atomic
from app.ui.paths import data_dir

ROLES = ("system", "user", "assistant")
TITLE_CHARS = 60


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
            write_json_atomic(self._path(conversation.id), asdict(conversation))

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
            try:
                conversations.append(Conversation.from_dict(read_json(path)))
            except CorruptFileError as e:
                backup = back_up_corrupt(path)
                notices.append(Notice("A chat history file was unreadable and has been moved to {backup} ({error})",
                                      {"backup": str(backup), "error": str(e)}))
        conversations.sort(key=lambda c: c.updated, reverse=True)
        return conversations, notices
