"""The tray's log file: a rotating file under the data folder that gives up quietly when the
disk does not take it (full, read-only, gone).

logging's default reaction to a failed write is ``--- Logging error ---`` and a traceback on
stderr for every record that follows: on a full disk, one per log line. Here the first failure
prints one warning and the handler stops writing; the app goes on without its file log.
"""

from __future__ import annotations

import logging
import sys
from logging.handlers import RotatingFileHandler


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
