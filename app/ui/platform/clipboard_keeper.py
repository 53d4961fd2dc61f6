"""Keep the user's clipboard after the tray quits (X11 without a clipboard manager).

On X11 the clipboard is not stored anywhere: its owner serves it on request, and it is gone
when the owner exits. Putting the user's clipboard back after an action (clipboard.py) makes
the tray its owner, so quitting the tray would empty it. As xclip and xsel do, the content then
goes to a small detached process (this module, ``python -m app.ui.platform.clipboard_keeper``)
that owns CLIPBOARD, serves it, and exits as soon as another program takes the clipboard (or
after ``KEEP_AT_MOST_MS``).

- Tray side, :func:`keep_clipboard_after_quit`: only on Qt's xcb platform, only while the tray
  owns CLIPBOARD, and only when no clipboard manager owns CLIPBOARD_MANAGER (with one, Qt hands
  the content to it at exit: SAVE_TARGETS). Windows, macOS and Wayland keep the clipboard
  themselves. The quit waits at most ``HAND_OVER_TIMEOUT_S``, until the keeper owns CLIPBOARD.
  PRIMARY is not handed over: the tray never puts it back, so what it holds there is its own.
- Keeper side, :func:`main`: stdin carries one JSON object, ``{"owner": the tray's window that
  owns CLIPBOARD, "formats": [[mime type, base64 data], ...]}`` (every format of the snapshot:
  text, HTML, images, file lists…); it answers one line on stdout, ``ready`` once it owns the
  clipboard, else why not.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import selectors
import subprocess
import sys
import time

from PySide6.QtCore import QMimeData, QTimer
from PySide6.QtGui import QClipboard, QGuiApplication

from app.ui.platform.clipboard import ClipboardSnapshot

log = logging.getLogger(__name__)

MODULE = "app.ui.platform.clipboard_keeper"
READY = b"ready"
HAND_OVER_TIMEOUT_S = 5.0  # the keeper's start (Python, Qt, the X connection) takes well under a second
KEEP_AT_MOST_MS = 24 * 3600 * 1000  # a safety net: nobody took the clipboard in a day
OWNER_POLL_MS = 5000  # also checked without a change notice (an X server without XFixes sends none)


class HandOverError(Exception):
    """Why the keeper did not take the clipboard (one line for the log)."""


# -- the tray, at quit ------------------------------------------------------------------------------
def keep_clipboard_after_quit(clipboard: QClipboard) -> subprocess.Popen | None:
    """Hand the clipboard the tray owns to a keeper process, on X11 with no clipboard manager.

    Returns the keeper (it owns CLIPBOARD now), or None when there was nothing to do or it failed;
    a failure is one line in the log, and the quit goes on as before."""
    if QGuiApplication.platformName() != "xcb" or not clipboard.ownsClipboard():
        return None
    snapshot = ClipboardSnapshot.take(clipboard)
    if not snapshot.formats:
        return None
    keeper = None
    try:
        with _Selections(os.environ.get("DISPLAY", "")) as selections:
            if selections.owner("CLIPBOARD_MANAGER"):
                return None  # Qt gives the clipboard to the manager when the application ends
            ours = selections.owner("CLIPBOARD")
            keeper = _start_keeper()
            _send_and_wait(keeper, keeper_payload(snapshot, ours), HAND_OVER_TIMEOUT_S)
            if selections.owner("CLIPBOARD") in (0, ours):
                raise HandOverError("it said it was ready, but does not own the clipboard")
    except Exception as e:  # noqa: BLE001 - whatever went wrong, the tray must still quit
        _stop(keeper)
        log.warning("the clipboard was not handed to a keeper process at quit: %s", e)
        return None
    log.info("the clipboard is kept by process %d after quitting (until another program takes it)", keeper.pid)
    return keeper


def keeper_payload(snapshot: ClipboardSnapshot, owner: int) -> bytes:
    formats = [[fmt, base64.b64encode(data).decode("ascii")] for fmt, data in snapshot.formats]
    return json.dumps({"owner": owner, "formats": formats}).encode("utf-8")


def _start_keeper() -> subprocess.Popen:
    # Its own session: it outlives the tray and the terminal or session manager that started it.
    return subprocess.Popen([sys.executable, "-m", MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _send_and_wait(keeper: subprocess.Popen, payload: bytes, timeout_s: float) -> None:
    """Write the payload and read the keeper's answer, together (a large image fills the pipe
    before the keeper reads it), never past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pending, answer = memoryview(payload), b""
    os.set_blocking(keeper.stdin.fileno(), False)
    with selectors.DefaultSelector() as selector:
        selector.register(keeper.stdin, selectors.EVENT_WRITE)
        selector.register(keeper.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HandOverError(f"no answer within {timeout_s:g} s")
            for key, _events in selector.select(left):
                if key.fileobj is keeper.stdin:
                    try:
                        pending = pending[os.write(keeper.stdin.fileno(), pending[:65536]):]
                    except BrokenPipeError:
                        pending = pending[:0]  # it ended early: its output says why
                    if not pending:
                        selector.unregister(keeper.stdin)
                        keeper.stdin.close()
                    continue
                chunk = os.read(keeper.stdout.fileno(), 4096)
                answer += chunk
                if READY in answer.splitlines():
                    keeper.stdout.close()
                    return
                if not chunk:
                    lines = answer.decode("utf-8", "replace").strip().splitlines()
                    raise HandOverError(lines[-1] if lines else f"it ended with status {keeper.wait(1)}")


def _stop(keeper: subprocess.Popen | None) -> None:
    if keeper is not None and keeper.poll() is None:
        keeper.kill()
        keeper.wait(1)


class _Selections:
    """Who owns an X selection, asked on a connection of its own (python-xlib): Qt does not say."""

    def __init__(self, display_name: str):
        from Xlib import display  # (Linux only: imported where it is used)

        self._display = display.Display(display_name or None)

    def owner(self, selection: str) -> int:
        """The owner's window id; 0 when nobody owns it."""
        owner = self._display.get_selection_owner(self._display.intern_atom(selection))
        return int(getattr(owner, "id", owner))  # (python-xlib gives a window, or 0 for none)

    def __enter__(self) -> _Selections:
        return self

    def __exit__(self, *_exc) -> None:
        self._display.close()


# -- the keeper process -----------------------------------------------------------------------------
def mime_from_payload(payload: bytes) -> tuple[int, QMimeData]:
    """(the tray's owner window, the content) from the tray's payload; ValueError when it is malformed."""
    try:
        fields = json.loads(payload)
        mime = QMimeData()
        for fmt, data in fields["formats"]:
            mime.setData(fmt, base64.b64decode(data, validate=True))
        return int(fields["owner"]), mime
    except (KeyError, TypeError, ValueError) as e:  # (binascii.Error and JSONDecodeError are ValueErrors)
        raise ValueError(f"malformed payload ({e})") from None


def main() -> int:
    try:
        owner, mime = mime_from_payload(sys.stdin.buffer.read())
    except ValueError as e:
        print(e, flush=True)
        return 2
    app = QGuiApplication([sys.argv[0], "-platform", "xcb"])  # offscreen would own nothing on the display
    with _Selections(os.environ.get("DISPLAY", "")) as selections:
        if selections.owner("CLIPBOARD") != owner:
            # Another program took the clipboard since the tray looked: that one is the user's now.
            print("the clipboard changed hands meanwhile: nothing to keep", flush=True)
            return 0
        clipboard = app.clipboard()
        clipboard.setMimeData(mime)
    if not clipboard.ownsClipboard():
        print("could not take the clipboard", flush=True)
        return 1

    def quit_once_taken() -> None:
        if not clipboard.ownsClipboard():
            app.quit()

    clipboard.dataChanged.connect(quit_once_taken)
    QTimer(app, interval=OWNER_POLL_MS, timeout=quit_once_taken).start()
    QTimer.singleShot(KEEP_AT_MOST_MS, app.quit)
    sys.stdout.buffer.write(READY + b"\n")
    sys.stdout.flush()
    _detach_output()
    return app.exec()


def _detach_output() -> None:
    """The tray stopped listening (and may be gone): later output, Qt's warnings too, goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
