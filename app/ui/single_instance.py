"""One Qwen Tray per user and settings folder; a second ``qwen-tray`` talks to the running one.

The running tray holds a lock file (QLockFile: a lock of a process that died is taken over) and
listens on a local socket (QLocalServer: a Unix socket, a named pipe on Windows), both named
after the user and the settings folder (``QWEN_TRAY_HOME``), so two users, or two test runs,
never meet. A second ``qwen-tray`` finds the lock taken, sends its request and exits:

- ``{"command": "activate", "argv": [...]}``: the running tray opens its chat window (or
  switches to ``--model``), instead of a second tray, model and set of hotkey grabs;
- ``{"command": "quit"}`` (``qwen-tray --replace``): it quits; the new one then takes the lock;
- ``{"command": "action", "id": ..., "text": ...}`` (``qwen-tray action``); ``{"command": "ping"}``.

One JSON line each way per connection; the reply is ``{"ok": true, "message": ...}`` or
``{"ok": false, "error": ...}``, at once or, for an action that waits for the model being
loaded, once the load is over (a PendingReply). Only QtCore and QtNetwork: the client needs no
display.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from app.errors import QwenTrayError
from app.paths import config_dir

CONNECT_TIMEOUT_MS = 1000
REPLY_TIMEOUT_MS = 15000
QUEUED_ACTION_LIMIT_S = 600  # how long an action waits for the model being loaded (a first-run kernel build)
QUEUED_REPLY_TIMEOUT_MS = (QUEUED_ACTION_LIMIT_S + 60) * 1000  # `qwen-tray action` waits that long for its answer
STARTING_TIMEOUT_S = 60.0  # how long a tray that holds the lock may take to start listening
QUIT_TIMEOUT_MS = 30000  # how long --replace waits for the running tray to quit
MAX_REQUEST_BYTES = 16 * 2**20  # `qwen-tray action NAME -` may hand over a long document

log = logging.getLogger(__name__)
Reply = dict


class PendingReply(QObject):
    """A reply given later: the handler returns it and emits ``ready`` with the reply when it has one."""
    ready = Signal(dict)


Handler = Callable[[dict], "Reply | PendingReply"]


class InstanceError(QwenTrayError):
    """The running tray could not be reached or asked (one sentence)."""


def instance_key() -> str:
    """The lock's and the socket's name: per user and per settings folder."""
    user = os.environ.get("USERNAME", "user") if sys.platform == "win32" else str(os.getuid())
    folder = str(config_dir().expanduser().resolve())
    return f"qwen-tray-{user}-{hashlib.sha256(folder.encode()).hexdigest()[:16]}"


def lock_path(key: str | None = None) -> Path:
    return Path(tempfile.gettempdir()) / f"{key or instance_key()}.lock"


class InstanceLock:
    """Who is the running tray: the process holding this lock."""

    def __init__(self, key: str | None = None):
        self.key = key or instance_key()
        self._lock = QLockFile(str(lock_path(self.key)))
        self._lock.setStaleLockTime(0)  # stale only when its process is gone, however old

    def try_claim(self, timeout_ms: int = 0) -> bool:
        return self._lock.tryLock(timeout_ms)

    def holder_pid(self) -> int | None:
        pid, _host, _app = self._lock.getLockInfo()  # (0, "", "") when there is none
        return pid or None

    def release(self) -> None:
        self._lock.unlock()


def send_request(request: dict, key: str | None = None, timeout_ms: int = REPLY_TIMEOUT_MS) -> Reply | None:
    """Send ``request`` to the running tray; its reply, or None when no tray listens."""
    socket = QLocalSocket()
    socket.connectToServer(key or instance_key())
    if not socket.waitForConnected(CONNECT_TIMEOUT_MS):
        return None
    socket.write(json.dumps(request, ensure_ascii=False).encode("utf-8") + b"\n")
    socket.flush()
    received = b""
    deadline = time.monotonic() + timeout_ms / 1000
    while b"\n" not in received and time.monotonic() < deadline:
        if socket.bytesToWrite():
            socket.waitForBytesWritten(100)
        if socket.waitForReadyRead(100) or socket.bytesAvailable():
            received += bytes(socket.readAll().data())
        elif socket.state() == QLocalSocket.UnconnectedState:
            break
    socket.abort()
    if b"\n" not in received:
        raise InstanceError("the running Qwen Tray did not answer (see its log: qwen-tray.log in its data folder)")
    try:
        reply = json.loads(received.split(b"\n", 1)[0])
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise InstanceError(f"the program listening on {key or instance_key()} is not a Qwen Tray that understood us")
    return reply


def request_running(request: dict, lock: InstanceLock, waited_s: float = STARTING_TIMEOUT_S,
                    reply_timeout_ms: int = REPLY_TIMEOUT_MS) -> Reply | None:
    """Send ``request`` to the tray holding ``lock``, waiting while it starts; None when none holds it."""
    deadline = time.monotonic() + waited_s
    while True:
        reply = send_request(request, lock.key, reply_timeout_ms)
        if reply is not None:
            return reply
        if lock.try_claim():  # nobody holds it (any more): no tray runs
            lock.release()
            return None
        if time.monotonic() >= deadline:
            pid = lock.holder_pid()
            raise InstanceError(f"a Qwen Tray (process {pid}) holds {lock_path(lock.key)} but does not answer; "
                                f"end that process (kill {pid}) and start again")
        time.sleep(0.2)


def hand_foreground_to(lock: InstanceLock, platform: str = sys.platform,
                       allow: Callable[[int], object] | None = None) -> None:
    """Let the tray holding ``lock`` bring its window to the front (Windows; a no-op elsewhere).

    Windows' foreground lock lets only the process the user just started or clicked raise a
    window; the tray's own ``raise_()`` / ``activateWindow()`` for a second start or a
    shortcut's ``qwen-tray action`` would only flash its taskbar button. This process (started
    by the user) has that right and hands it to the tray's process with AllowSetForegroundWindow
    before it asks (``allow`` stands in for it in tests). Failing to is harmless: the button
    then flashes, as before."""
    pid = lock.holder_pid()
    if platform != "win32" or pid is None:  # (no holder: no tray to hand it to)
        return
    if allow is None:
        import ctypes
        from ctypes import wintypes

        allow = ctypes.WinDLL("user32").AllowSetForegroundWindow
        allow.argtypes, allow.restype = (wintypes.DWORD,), wintypes.BOOL
    allow(pid)


def claim_instance(argv: list[str], replace: bool = False, out=sys.stdout) -> InstanceLock | None:
    """The lock for a new tray; or None when a running one took ``argv`` (this process then exits 0).
    With ``replace`` the running tray is asked to quit first."""
    lock = InstanceLock()
    if lock.try_claim():
        return lock
    pid = lock.holder_pid()
    if replace:
        reply = request_running({"command": "quit"}, lock)
        if not lock.try_claim(QUIT_TIMEOUT_MS):
            raise InstanceError(f"the running Qwen Tray (process {pid}) did not quit within "
                                f"{QUIT_TIMEOUT_MS // 1000} s{_said(reply)}")
        return lock
    hand_foreground_to(lock)  # it opens its chat window: in front
    reply = request_running({"command": "activate", "argv": argv}, lock)
    if reply is None:  # it quit meanwhile: this one runs
        if lock.try_claim():
            return lock
        raise InstanceError("another Qwen Tray is starting; try again in a moment")
    if not reply.get("ok"):
        raise InstanceError(f"the running Qwen Tray (process {pid}) refused: {reply.get('error')}")
    print(f"Qwen Tray is already running (process {pid}): {reply.get('message', '')}", file=out)
    return None


def _said(reply: Reply | None) -> str:
    return f" (it said: {reply.get('message') or reply.get('error')})" if reply else ""


class InstanceServer(QObject):
    """The running tray's end: each request line goes to ``handler``; its reply goes back."""

    def __init__(self, lock: InstanceLock, handler: Handler, parent: QObject | None = None):
        super().__init__(parent)
        self._lock, self._handler = lock, handler
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.UserAccessOption)
        QLocalServer.removeServer(lock.key)  # a socket left by a tray that died (we hold the lock)
        if not self._server.listen(lock.key):
            raise InstanceError(f"cannot listen for other qwen-tray commands on {lock.key}: "
                                f"{self._server.errorString()}")
        self._server.newConnection.connect(self._accept)
        self._buffers: dict[QLocalSocket, bytes] = {}
        self._pending: dict[QLocalSocket, PendingReply] = {}

    def _accept(self) -> None:
        while (connection := self._server.nextPendingConnection()) is not None:
            self._buffers[connection] = b""
            connection.readyRead.connect(lambda c=connection: self._read(c))
            connection.disconnected.connect(lambda c=connection: self._forget(c))

    def _read(self, connection: QLocalSocket) -> None:
        data = self._buffers.get(connection, b"") + bytes(connection.readAll().data())
        if b"\n" not in data and len(data) <= MAX_REQUEST_BYTES:
            self._buffers[connection] = data
            return
        self._buffers[connection] = b""
        reply = self._reply(data.split(b"\n", 1)[0]) if b"\n" in data else \
            {"ok": False, "error": f"the request is longer than {MAX_REQUEST_BYTES // 2**20} MiB"}
        if isinstance(reply, PendingReply):
            self._pending[connection] = reply
            reply.ready.connect(lambda later, c=connection: self._send(c, later))
            return
        self._send(connection, reply)

    def _send(self, connection: QLocalSocket, reply: Reply) -> None:
        self._pending.pop(connection, None)
        if connection not in self._buffers:  # the other process gave up waiting
            return
        connection.write(json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n")
        connection.flush()
        connection.disconnectFromServer()

    def _reply(self, line: bytes) -> Reply | PendingReply:
        try:
            request = json.loads(line)
        except (UnicodeDecodeError, ValueError):
            return {"ok": False, "error": "the request is not a JSON line"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "the request must be a JSON object"}
        try:
            return self._handler(request)
        except QwenTrayError as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # noqa: BLE001 - the other process gets an answer; the log gets the traceback
            log.exception("request %r failed", request.get("command"))
            return {"ok": False, "error": f"internal error: {e}"}

    def _forget(self, connection: QLocalSocket) -> None:
        self._buffers.pop(connection, None)
        self._pending.pop(connection, None)
        connection.deleteLater()

    def close(self) -> None:
        """Stop listening and give the lock up (a new tray may start now)."""
        self._server.close()
        self._lock.release()
