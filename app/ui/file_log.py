"""The tray's log file: a rotating file under the data folder that gives up quietly when the
disk does not take it (full, read-only, gone); and the stand-in that writes a missing stderr
(pythonw) into it.

logging's default reaction to a failed write is ``--- Logging error ---`` and a traceback on
stderr for every record that follows: on a full disk, one per log line. Here the first failure
prints one warning and the handler stops writing; the app goes on without its file log.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path


class FileLogHandler(RotatingFileHandler):
    def __init__(self, path, max_bytes: int = 1_000_000, backups: int = 2):
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        self.failed = False  # set at the first failed write; nothing is written after it

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        if self.failed:
            return
        self.failed = True
        error = sys.exc_info()[1]
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        stream = sys.stderr  # None under pythonw (Windows, no console): then nobody is told here
        if stream is not None:
            try:
                stream.write(f"qwen-tray: warning: cannot write the log file {self.baseFilename} ({reason}); "
                             "logging to it stops until the app restarts\n")
                stream.flush()
            except (OSError, ValueError):
                pass
        stream, self.stream = self.stream, None
        if stream is not None:
            try:
                stream.close()  # (closes the file even when the buffered text cannot be flushed)
            except OSError:
                pass


class LogFileStream(io.TextIOBase):
    """What stands in for ``sys.stderr`` where there is none (pythonw.exe: the Start-menu and
    action shortcuts on Windows): each line goes to the tray's log file, so a failed start or a
    refused ``qwen-tray action`` leaves a trace there instead of vanishing.

    The file is opened for each line and closed at once: the running tray's handler must stay
    able to rotate it (Windows refuses to rename a file another process holds open), and a
    command that never writes creates nothing. A line that cannot be written is dropped: there is
    nowhere else to say so."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._partial = ""  # text after the last newline (print writes the text and "\n" apart)
        self._lock = threading.Lock()

    @property
    def encoding(self) -> str:  # what the file is written in (a stream's users may ask; TextIOBase says None)
        return "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            if lines:
                self._append(lines)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._partial:
                self._append([self._partial])
                self._partial = ""

    def _append(self, lines: list[str]) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        text = "".join(f"{stamp} STDERR qwen-tray (process {os.getpid()}): {line}\n" for line in lines)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8", errors="replace") as log:
                log.write(text)
        except OSError:
            pass
