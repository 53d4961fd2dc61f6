"""The first words of a text, for one-line previews (the popup's source line, History titles).

Words alone never shorten Chinese or Japanese: they have no spaces, so a whole paragraph is one
"word". The preview is also capped by width, a wide (CJK) character counting as two columns, so
an English preview keeps its words and a Chinese one stops after about 40 characters.
"""

from __future__ import annotations

import unicodedata

PREVIEW_COLUMNS = 80  # ~40 CJK characters; eight to ten English words fit


def _columns(char: str) -> int:
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def text_preview(text: str, words: int, columns: int = PREVIEW_COLUMNS) -> str:
    """The first ``words`` words of ``text``, cut at ``columns`` columns; " …" / "…" where cut."""
    parts = text.split()
    shown = " ".join(parts[:words])
    used = 0
    for index, char in enumerate(shown):
        used += _columns(char)
        if used > columns:
            return shown[:index].rstrip() + "…"
    return shown + (" …" if len(parts) > words else "")
