"""Text a command is given (an argument or standard input), as str the tokenizer can take;
and whether a console stream is a terminal.

Standard input is read as bytes and decoded here, not by the locale's text layer:

- a UTF-8 byte order mark (Notepad's "UTF-8 with BOM") is dropped, not handed to the model;
- UTF-16 with its byte order mark (a file that Windows PowerShell 5.1's ``>`` or Notepad's
  "Unicode" wrote, redirected with ``<``) is decoded as UTF-16;
- anything else is UTF-8 if it decodes as UTF-8 (strictly: GBK bytes are never half-read as
  UTF-8), else text in the system's legacy encoding: on Windows its ANSI code page, cp936 on
  Chinese Windows, which is what ``echo 总结一下 | qwen-tray ...`` in cmd.exe and a Notepad "ANSI"
  file give (the console code page is the same 936 there); elsewhere the locale's encoding;
- bytes that neither decodes are refused in one sentence naming the encodings tried: a guess
  beyond them would hand the model garbage.

Windows PowerShell 5.1 itself encodes what it pipes to a program as ``$OutputEncoding`` (ASCII:
Chinese arrives as "?" and cannot be recovered here; README: "Windows: consoles, pipes and encodings").

An argument arrives decoded by Python; bytes it could not decode (a terminal in another locale)
become U+FFFD and the user is told how many, rather than a traceback from the tokenizer or the
JSON line to the tray: the rest of the text is still worth an answer.
"""

from __future__ import annotations

import codecs
import io
import locale
import sys

from app.errors import QwenTrayError

NOT_UTF8 = "qwen-tray: note: the text is not valid UTF-8; {n} invalid sequence(s) were replaced with U+FFFD"
UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def from_stdin() -> str:
    stream = sys.stdin
    if stream is None:  # pythonw.exe (a shortcut on Windows) has no console and no standard input
        raise QwenTrayError("'-' reads standard input, and this process has none (started without a console); "
                            "give the text as an argument instead")
    if isinstance(stream, io.TextIOWrapper):  # the real one: its bytes, not its locale's decoding
        return decode_input(stream.buffer.read(), legacy_encoding())
    return from_argument(stream.read())  # a text stream handed in (tests, embedding)


def legacy_encoding() -> str:
    """The encoding text that is not UTF-8 is in here: the ANSI code page on Windows (cp936,
    cp1252...), the locale's elsewhere; also in Python's UTF-8 mode, which only says how Python
    itself writes (locale.getencoding, Python 3.11+; 3.10's getpreferredencoding follows UTF-8 mode)."""
    if sys.version_info >= (3, 11):
        return locale.getencoding()
    return locale.getpreferredencoding(False)


def decode_input(raw: bytes, fallback: str) -> str:
    """``raw`` (standard input's bytes) as text: a byte order mark's encoding, else UTF-8, else
    ``fallback`` (:func:`legacy_encoding`); QwenTrayError when none of them decodes it."""
    if raw.startswith(codecs.BOM_UTF8):
        return _decoded_as(raw, len(codecs.BOM_UTF8), "utf-8", "UTF-8")
    if raw.startswith(UTF16_BOMS):
        return _decoded_as(raw, 0, "utf-16", "UTF-16")  # (the codec takes the mark's byte order, drops the mark)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        not_utf8 = e
    if codecs.lookup(fallback).name == "utf-8":
        raise QwenTrayError(f"standard input is not UTF-8 text ({_where(not_utf8)}); "
                            "convert it to UTF-8 and try again") from None
    try:
        return raw.decode(fallback)
    except UnicodeDecodeError:
        raise QwenTrayError(f"standard input is neither UTF-8 text ({_where(not_utf8)}) nor {fallback} text, "
                            f"this system's code page; convert it to UTF-8 and try again") from None


def _decoded_as(raw: bytes, start: int, encoding: str, name: str) -> str:
    """``raw`` from ``start`` on (after a mark the codec would keep) decoded as a byte order mark said."""
    try:
        return raw[start:].decode(encoding)
    except UnicodeDecodeError as e:
        raise QwenTrayError(f"standard input starts with {name}'s byte order mark but is not {name} text "
                            f"({_where(e, start)}); convert it to UTF-8 and try again") from None


def _where(error: UnicodeDecodeError, start: int = 0) -> str:
    return f"byte 0x{error.object[error.start]:02x} at offset {start + error.start}"


def from_argument(text: str) -> str:
    """An argument as Python received it: undecodable bytes arrive as lone surrogates."""
    return _replaced(text.encode("utf-8", "surrogateescape"))


def _replaced(raw: bytes) -> str:
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
