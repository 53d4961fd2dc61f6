"""Notices clients that hang up while their request waits or generates.

A streaming response finds out at its next failed write, but a request that is still
queued (or a non-streaming one) writes nothing until it is done. One thread watches every
such connection: a socket that turns readable and peeks as EOF (or errors) means the
client is gone, so its generation is cancelled at once and the slot is freed.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("app.server")

# Registration changes are applied between select() calls; Windows' select-based selector
# picks them up within this interval even if the wake-up socket is missed.
_POLL_INTERVAL_S = 0.25


class DisconnectWatcher:
    """Calls ``on_disconnect`` once when a watched client socket reaches EOF or errors."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, socket.socket, Callable[[], None] | None]] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qwen-tray-disconnect-watcher", daemon=True)
        self._thread.start()

    def watch(self, sock: socket.socket, on_disconnect: Callable[[], None]) -> None:
        self._change("add", sock, on_disconnect)

    def unwatch(self, sock: socket.socket) -> None:
        """Stop watching; returns before the watcher thread applies it, which is harmless
        because callbacks only cancel generations that are already finished by then."""
        self._change("remove", sock, None)

    def close(self) -> None:
        self._stopping.set()
        self._wake()
        self._thread.join(timeout=5)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- watcher thread -----------------------------------------------------------------------
    def _change(self, op: str, sock: socket.socket, callback: Callable[[], None] | None) -> None:
        with self._lock:
            self._pending.append((op, sock, callback))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:  # buffer full (a wake-up is already pending) or closed at shutdown
            pass

    def _apply_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for op, sock, callback in pending:
            try:
                if op == "add":
                    self._selector.register(sock, selectors.EVENT_READ, callback)
                else:
                    self._selector.unregister(sock)
            except (KeyError, ValueError, OSError):  # closed already / never registered
                pass

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._apply_pending()
            try:
                events = self._selector.select(timeout=_POLL_INTERVAL_S)
            except OSError:  # a socket closed under select (Windows): drop the dead ones next round
                self._drop_closed()
                continue
            for key, _ in events:
                if key.fileobj is self._wake_r:
                    self._drain_wake()
                else:
                    self._check(key.fileobj, key.data)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:  # BlockingIOError: drained
            pass

    def _check(self, sock, on_disconnect: Callable[[], None]) -> None:
        try:
            gone = sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return
        except OSError:  # reset/aborted by the peer
            gone = True
        # Either the client left, or it sent more bytes (pipelining) which we must not eat;
        # both end the watch so a readable socket does not spin this loop.
        self._unregister(sock)
        if gone:
            try:
                on_disconnect()
            except Exception:  # a callback bug must not kill the watcher for everyone
                log.exception("disconnect callback failed")

    def _unregister(self, sock) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass

    def _drop_closed(self) -> None:
        for key in list(self._selector.get_map().values()):
            if key.fileobj is not self._wake_r and getattr(key.fileobj, "fileno", lambda: -1)() < 0:
                self._unregister(key.fileobj)


class ActiveRequest:
    """A generation being served; ``on_client_gone`` runs on the watcher thread."""

    def __init__(self, generation: Any):
        self.generation = generation
        self.client_gone = False

    def on_client_gone(self) -> None:
        self.client_gone = True
        self.generation.cancel()

    @property
    def cut_short(self) -> bool:
        """The client left and its generation was stopped before it finished on its own."""
        if not (self.client_gone and self.generation.done):
            return False
        try:
            return self.generation.result.finish_reason == "cancelled"
        except Exception:  # noqa: BLE001 - the generation failed: it was not cut short by us
            return False
