"""The History window's model: chats and action results as one list, searched, and exported to
Markdown (written atomically).

An entry is made of parts: our headings and the model's answers are Markdown; what someone typed
(a chat message, the text given to an action) is shown as typed, as the chat shows it. In the
exported file each part stands alone: an answer cut inside a code block gets its closing fence,
and typed text goes in a fence that nothing in it can close, so no entry runs into the next."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from app.paths import atomic_write_text
from app.ui.action_history import ActionRecord
from app.ui.history import Conversation, finish_note
from app.ui.i18n import tr
from app.ui.markdown_fences import escaped, fenced, with_fences_closed
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


@dataclass(frozen=True)
class EntryPart:
    """A piece of an entry: Markdown, or (``typed``) text to show exactly as it was typed."""

    text: str
    typed: bool = False

    def markdown(self) -> str:
        """The part in an exported document, where it cannot run into what follows."""
        return fenced(self.text) if self.typed else with_fences_closed(self.text)


def _headed(heading: str, text: str, typed: bool) -> list[EntryPart]:
    """A bold heading and the text under it (none where it is empty: an answer stopped before its
    first word). Typed text keeps the first line's indentation (pasted code)."""
    body = text.strip("\r\n") if typed else text.strip()
    return [EntryPart(f"**{heading}**")] + ([EntryPart(body, typed)] if body.strip() else [])


def entry_parts(entry: HistoryEntry) -> list[EntryPart]:
    item = entry.item
    if isinstance(item, Conversation):
        parts = [EntryPart(f"## {escaped(entry.title())}\n\n*{_time(item.updated)}*")]
        # Headings are keyed with their colon: Chinese writes "：", and "Answer:" is not the mode "Answer".
        speakers = {"user": tr("You:"), "assistant": tr("Assistant:"), "system": tr("Instructions:")}
        for message in item.messages:
            parts += _headed(speakers[message.role], message.content, typed=message.role != "assistant")
            if finish_note(message.finish):  # as the chat shows it under the answer
                parts.append(EntryPart(f"*{finish_note(message.finish)}*"))
        return parts
    when = f"{_time(item.created)} · {tr('Model: {model}', model=escaped(item.model))}"
    return ([EntryPart(f"## {escaped(item.action)}\n\n*{when}*")]
            + _headed(tr("Text:"), item.source, typed=True) + _headed(tr("Answer:"), item.answer, typed=False))


def entry_markdown(entry: HistoryEntry) -> str:
    return "\n\n".join(part.markdown() for part in entry_parts(entry)) + "\n"


def history_markdown(shown: list[HistoryEntry]) -> str:
    header = [f"# {tr('Qwen Tray history')}", "", tr("Exported {when}", when=_time(time.time())), ""]
    return "\n".join(header + [entry_markdown(e) for e in shown])


def export_markdown(path: Path, shown: list[HistoryEntry]) -> None:
    """Write ``shown`` to ``path`` as Markdown (a crash leaves the old file or the new one), readable
    as any document the user saves (the history itself stays private)."""
    atomic_write_text(path, history_markdown(shown), mode=0o644)
