"""The CLI's standard output and error, made safe to write before any command runs.

Missing streams. ``pythonw.exe`` (the Start-menu shortcut, an action's shortcut key on Windows)
runs without a console: ``sys.stdout`` and ``sys.stderr`` are None, and the first ``write`` or
``flush`` raises AttributeError. Standard error then goes to the tray's log file
(:class:`app.ui.file_log.LogFileStream`), so an error there is found later; standard output
(``ran summarize``, a listing nobody sees) goes to the null device.

Characters the output cannot encode. On Windows, Python writes to a console in UTF-16 (any
character shows), but to a pipe or a file in the ANSI code page (cp936 on Chinese Windows,
cp1252 on English) with ``errors="strict"``: ``qwen-tray ask ... > answer.txt`` stopped with a
UnicodeEncodeError at the first emoji of an answer, ``action --list | findstr`` at a "✓". The
encoding Python chose is kept: it is what cmd's ``type``, ``findstr``, Notepad's "ANSI" and
PowerShell's default ``[Console]::OutputEncoding`` read on Chinese Windows (936 is the ANSI and
the console code page there), while UTF-8 would turn every Chinese character of a PowerShell
capture into mojibake. What the code page lacks becomes "?" instead of a traceback. Whoever wants
every character sets ``PYTHONUTF8=1`` (then output is UTF-8; README: "Windows: consoles, pipes
and encodings"). A stream that already replaces (stderr's default ``backslashreplace``) is left so.
"""

from __future__ import annotations

import io
import os
import sys


def prepare_streams() -> None:
    """Give ``sys.stdout`` / ``sys.stderr`` a place to go where they are None, and make both
    replace what their encoding cannot write."""
    if sys.stderr is None:
        from app.paths import log_file
        from app.ui.file_log import LogFileStream  # (no Qt: only logging and the file)

        sys.stderr = LogFileStream(log_file())
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's stdout, open until exit
    for stream in (sys.stdout, sys.stderr):
        replace_unencodable(stream)


def replace_unencodable(stream) -> None:
    """Make ``stream`` write "?" for a character its encoding lacks, where it would raise."""
    if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
        stream.reconfigure(errors="replace")
