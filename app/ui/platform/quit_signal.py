"""SIGTERM (``kill``, a session or service manager) quits the tray the way its Quit item does.

Python's default SIGTERM ends the process on the spot: no shutdown, so nothing that quitting
does happens (the clipboard handed to its keeper on X11, the model jobs stopped where they
resume). A Python signal handler runs only when Python code runs, and Qt's idle event loop runs
none: ``signal.set_wakeup_fd`` writes to a socket that a QSocketNotifier watches, which wakes
the loop; the handler then runs and asks Qt to quit.
"""

from __future__ import annotations

import signal
import socket
import sys

from PySide6.QtCore import QCoreApplication, QSocketNotifier

_wakeup: list[tuple[socket.socket, socket.socket, QSocketNotifier]] = []


def quit_on_sigterm(app: QCoreApplication) -> None:
    """From now on SIGTERM quits ``app``'s event loop (call on the main thread; not on Windows,
    where nothing sends SIGTERM)."""
    if sys.platform == "win32":
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno())
    notifier = QSocketNotifier(reader.fileno(), QSocketNotifier.Type.Read, app)
    notifier.activated.connect(lambda *_args: _drain(reader))
    _wakeup.append((reader, writer, notifier))  # open (and watched) for the rest of the process
    signal.signal(signal.SIGTERM, lambda _signum, _frame: app.quit())


def _drain(reader: socket.socket) -> None:
    try:
        while reader.recv(64):
            pass
    except BlockingIOError:
        pass
