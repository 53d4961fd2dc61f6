"""The History window's reading pane: one entry, its headings and the model's answers rendered as
Markdown, what the user typed shown as typed (as the chat shows it)."""

from __future__ import annotations

import html

from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.ui.history_export import EntryPart, HistoryEntry, entry_markdown, entry_parts


class EntryView(QTextBrowser):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self._markdown = ""

    def markdown_text(self) -> str:
        """The entry as Export writes it."""
        return self._markdown

    def show_entry(self, entry: HistoryEntry | None) -> None:
        self._markdown = entry_markdown(entry) if entry else ""
        self.setHtml("".join(_part_html(part) for part in entry_parts(entry)) if entry else "")


def _part_html(part: EntryPart) -> str:
    if part.typed:
        # No Markdown, no HTML: the spaces and line breaks kept, long lines wrapped; the margins of
        # the Markdown paragraphs around it.
        return f'<p style="margin-top:6px; margin-bottom:6px; white-space:pre-wrap;">{html.escape(part.text)}</p>'
    # Each part read on its own, so none runs into the next (an answer cut inside a code block
    # ends there), and written out as Qt's own HTML, which reads back as the same paragraphs.
    document = QTextDocument()
    document.setMarkdown(part.text)
    page = document.toHtml()
    return page[page.index(">", page.index("<body")) + 1:page.rindex("</body>")]
