"""Fenced code blocks, as CommonMark reads them, in text put into a Markdown document of ours.

An answer stopped or cut at the answer length while writing code ends inside a fence; put into
the History export as it is, that fence would run on to the end of the file and turn every later
entry into code. ``with_fences_closed`` gives such a message the closing fence it lacks.
``fenced`` wraps text to show as typed in a fence that nothing in the text can close.

The scanner follows CommonMark where answers put fences: at the top level, in list items (the
fence indented under the item, or on the item's own line) and in block quotes. A fence is closed
by a line of the same character, at least as long, indented at most 3 spaces past its container's
content; or by the end of its container (a line indented less than its list item, a line without
its block quote's ``>``). HTML blocks are not read: a fence line inside one counts as a fence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_QUOTE_MARKER = re.compile(r" {0,3}> ?")
_LIST_MARKER = re.compile(r"(?:[-+*]|\d{1,9}[.)])(?: +|$)")
_THEMATIC_BREAK = re.compile(r"([-*_])(?: *\1){2,} *$")
_SETEXT_UNDERLINE = re.compile(r"(?:=+|-+) *$")
_FENCE = re.compile(r"(`{3,}|~{3,})(.*)")
_HEADING = re.compile(r"#{1,6}(?: |$)")
_CLOSING_FENCE = re.compile(r"(`{3,}|~{3,}) *")
_BACKTICK_RUN = re.compile(r"`+")
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_\[\]<>&~#|])")


def escaped(text: str) -> str:
    """``text`` (a title, a name, an error message) in a Markdown line, shown as it is: ``__init__``
    and ``*args`` not read as emphasis, ``<b>`` not as HTML."""
    return _MARKDOWN_PUNCTUATION.sub(r"\\\1", text)


def with_fences_closed(markdown: str) -> str:
    """``markdown``, with a closing fence after it when it ends inside a fenced code block."""
    scanner = _FenceScanner()
    for line in markdown.splitlines():
        scanner.feed(line)
    closing = scanner.closing_line()
    return markdown if closing is None else f"{markdown}\n{closing}"


def fenced(text: str, info: str = "text") -> str:
    """``text`` as a fenced code block: shown exactly as typed, and no line of it (``` included)
    can end the block early (the fence is longer than any run of backticks in it)."""
    longest = max((len(run) for run in _BACKTICK_RUN.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


@dataclass(frozen=True)
class _OpenFence:
    char: str  # ` or ~
    length: int
    quotes: int  # how many block quotes it is in
    item_column: int  # where the content of its list item starts (0: in none)
    column: int  # where the fence itself starts (after the quotes' markers)


def _without_quotes(line: str, most: int | None = None) -> tuple[int, str]:
    """How many block-quote markers start ``line`` (counting at most ``most``), and the rest."""
    count = 0
    while most is None or count < most:
        marker = _QUOTE_MARKER.match(line)
        if marker is None:
            break
        count, line = count + 1, line[marker.end():]
    return count, line


def _fence_opening(text: str, column: int) -> re.Match | None:
    """The fence that opens at ``column``, if one does (a backtick fence's info has no backtick)."""
    fence = _FENCE.match(text, column)
    return None if fence is None or (fence.group(1)[0] == "`" and "`" in fence.group(2)) else fence


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip(" "))


class _FenceScanner:
    """Reads a message line by line, knowing at each line whether a fence is open."""

    def __init__(self) -> None:
        self.fence: _OpenFence | None = None
        self.items: list[int] = []  # content columns of the list items open around the line
        self.quotes = 0
        # The line before was paragraph text: a less indented line goes on with it (CommonMark's
        # lazy continuation) and does not end the list item.
        self.in_paragraph = False
        self.empty_item = False  # the line before started a list item with nothing in it

    def feed(self, line: str) -> None:
        line = line.expandtabs(4)  # CommonMark's tab stops
        if self.fence is not None:
            quotes, rest = _without_quotes(line, self.fence.quotes)
            if quotes == self.fence.quotes and (not rest.strip() or _indent(rest) >= self.fence.item_column):
                if self._closes(rest):
                    self.fence = None
                return
            self.fence = None  # its block quote or list item ended here, and the fence with it
        self._outside_fence(*_without_quotes(line))

    def _closes(self, rest: str) -> bool:
        fence = self.fence
        closing = _CLOSING_FENCE.fullmatch(rest.lstrip(" "))
        return (closing is not None and _indent(rest) - fence.item_column <= 3
                and closing.group(1)[0] == fence.char and len(closing.group(1)) >= fence.length)

    def _outside_fence(self, quotes: int, rest: str) -> None:
        if quotes != self.quotes:  # another block quote: lists of its own, and no paragraph yet
            self.items, self.quotes, self.in_paragraph = [], quotes, False
        if not rest.strip():
            if self.empty_item and self.items:
                self.items.pop()  # CommonMark: an item starts with at most one blank line
            self.in_paragraph = self.empty_item = False  # (a blank line leaves the other items open)
            return
        self.empty_item = False
        column = self._after_list_markers(rest)
        base = self._base(column)
        fence = _fence_opening(rest, column)
        if fence and column - base <= 3:
            self.fence = _OpenFence(fence.group(1)[0], len(fence.group(1)), quotes, base, column)
            self.in_paragraph = False
        elif column - base > 3 and not self.in_paragraph:
            pass  # indented code: not a paragraph
        else:
            ends_paragraph = (_HEADING, _THEMATIC_BREAK) + ((_SETEXT_UNDERLINE,) if self.in_paragraph else ())
            self.in_paragraph = bool(rest[column:].strip()) and not any(b.match(rest, column) for b in ends_paragraph)

    def _base(self, column: int) -> int:
        """Where the content of the list item a line indented to ``column`` belongs to starts."""
        return max((item for item in self.items if item <= column), default=0)

    def _starts_block(self, rest: str, column: int) -> bool:
        if column - self._base(column) > 3:
            return False  # indented code, or text going on with a paragraph
        return bool(self._list_marker(rest, column) or _HEADING.match(rest, column)
                    or _THEMATIC_BREAK.match(rest, column) or _fence_opening(rest, column))

    def _after_list_markers(self, rest: str) -> int:
        """Where the line's content starts, after the markers of the list items it starts; the
        list items it ends are dropped and those it starts are kept."""
        column = _indent(rest)
        starts_block = self._starts_block(rest, column)
        if starts_block or not self.in_paragraph:  # (else: text going on with the paragraph)
            while self.items and self.items[-1] > column:
                self.items.pop()
        if starts_block:
            self.in_paragraph = False
        while marker := self._list_marker(rest, column):
            spaces = len(marker.group(0)) - len(marker.group(0).rstrip(" "))
            # 1 to 4 spaces after the marker: the content starts after them; none (the line ends)
            # or more: one column after the marker (the rest is indented code)
            content = marker.end() if 1 <= spaces <= 4 else marker.end() - spaces + 1
            self.items.append(content)
            self.in_paragraph, self.empty_item = False, not rest[marker.end():].strip()
            column = content + _indent(rest[content:])
        return column

    def _list_marker(self, rest: str, column: int) -> re.Match | None:
        """The marker of a list item that starts at ``column``, if one does."""
        marker = _LIST_MARKER.match(rest, column)
        if marker is None or _THEMATIC_BREAK.match(rest, column) or column - self._base(column) > 3:
            return None
        number = marker.group(0).rstrip(" ")[:-1]
        interrupts = self.in_paragraph and column >= (self.items[-1] if self.items else 0)
        if interrupts and (not rest[marker.end():].strip() or (number.isdigit() and int(number) != 1)):
            return None  # CommonMark: an empty item, or a list from 2 on, does not interrupt a paragraph
        return marker

    def closing_line(self) -> str | None:
        """The line that closes the fence open at the end, in its block quotes and list item."""
        fence = self.fence
        if fence is None:
            return None
        return "> " * fence.quotes + " " * fence.column + fence.char * fence.length
