"""The History window's model: chats and action results as one list, searched, and exported to
Markdown (written atomically)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from app.paths import atomic_write_text
from app.ui.action_history import ActionRecord
from app.ui.history import Conversation
from app.ui.i18n import tr
from app.ui.text_preview import text_preview

PREVIEW_WORDS = 10


@dataclass(frozen=True)
class HistoryEntry:
    """A conversation or an action result, as the History window lists it."""

    item: Conversation | ActionRecord

    @property
    def is_chat(self) -> bool:
        return isinstance(self.item, Conversation)

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def when(self) -> float:
        return self.item.updated if isinstance(self.item, Conversation) else self.item.created

    def title(self) -> str:
        if isinstance(self.item, Conversation):
            return tr("Chat: {title}", title=self.item.title or tr("(untitled)"))
        return tr("{action}: {preview}", action=self.item.action, preview=text_preview(self.item.source, PREVIEW_WORDS))

    def matches(self, query: str) -> bool:
        """Every word of ``query`` somewhere in the entry (case-insensitive)."""
        text = self.item.text().casefold()
        return all(word in text for word in query.casefold().split())


def entries(conversations: list[Conversation], records: list[ActionRecord]) -> list[HistoryEntry]:
    """Both kinds in one list, newest first."""
    both = [HistoryEntry(c) for c in conversations] + [HistoryEntry(r) for r in records]
    return sorted(both, key=lambda e: e.when, reverse=True)


def _time(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.strip().splitlines())


def entry_markdown(entry: HistoryEntry) -> str:
    item = entry.item
    if isinstance(item, Conversation):
        lines = [f"## {entry.title()}", "", f"*{_time(item.updated)}*", ""]
        # Headings are keyed with their colon: Chinese writes "：", and "Answer:" is not the mode "Answer".
        speakers = {"user": tr("You:"), "assistant": tr("Assistant:"), "system": tr("Instructions:")}
        for message in item.messages:
            lines += [f"**{speakers[message.role]}**", "", message.content.strip(), ""]
        return "\n".join(lines)
    return "\n".join([
        f"## {item.action}", "", f"*{_time(item.created)} · {tr('Model: {model}', model=item.model)}*", "",
        f"**{tr('Text:')}**", "", _quoted(item.source), "", f"**{tr('Answer:')}**", "", item.answer.strip(), ""])


def history_markdown(shown: list[HistoryEntry]) -> str:
    header = [f"# {tr('Qwen Tray history')}", "", tr("Exported {when}", when=_time(time.time())), ""]
    return "\n".join(header + [entry_markdown(e) for e in shown])


def export_markdown(path: Path, shown: list[HistoryEntry]) -> None:
    """Write ``shown`` to ``path`` as Markdown (a crash leaves the old file or the new one), readable
    as any document the user saves (the history itself stays private)."""
    atomic_write_text(path, history_markdown(shown), mode=0o644)
