"""Text a command is given (an argument or standard input), as str the tokenizer can take;
and whether a console stream is a terminal.

Bytes that are not UTF-8 (a file in a legacy encoding piped in, a terminal in another
locale) become U+FFFD and the user is told how many, rather than a traceback from the
tokenizer or the JSON line to the tray: the rest of the text is still worth an answer.
"""

from __future__ import annotations

import io
import sys

NOT_UTF8 = "qwen-tray: note: the text is not valid UTF-8; {n} invalid sequence(s) were replaced with U+FFFD"


def from_stdin() -> str:
    stream = sys.stdin
    if isinstance(stream, io.TextIOWrapper):  # the real one: its bytes, not its locale's decoding
        return _decoded(stream.buffer.read())
    return from_argument(stream.read())  # a text stream handed in (tests, embedding)


def from_argument(text: str) -> str:
    """An argument as Python received it: undecodable bytes arrive as lone surrogates."""
    return _decoded(text.encode("utf-8", "surrogateescape"))


def _decoded(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    bad = text.count("\ufffd") - raw.count("\ufffd".encode())
    if bad:
        print(NOT_UTF8.format(n=bad), file=sys.stderr)
    return text


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or a file-like object
        return False
