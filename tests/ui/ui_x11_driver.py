"""The tray app under test in the X11 end-to-end test, with real hotkeys, keys and clipboard.

``--model PATH`` loads that folder with the real engine; ``--fake`` uses the fake backend;
``--hold-load``: the load starts (event "loading") and goes on when stdin says "release-load".
Events are JSON lines on stdout: ready, captured (the text an action runs on and where it
came from), answer (with the Replace button's screen position and the popup's state),
pasted, notice, log (what the clipboard keeper logs at quit). stdin: "quit"; SIGTERM quits
too, as it does the real tray. Like the real tray it answers other ``qwen-tray`` processes
(``qwen-tray action``) through the single-instance server. Offscreen (no DISPLAY) with
``--fake`` it needs no X server.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading

from PySide6.QtCore import QObject, QPoint, Signal
from PySide6.QtWidgets import QApplication


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


class Commands(QObject):
    received = Signal(str)


class LogEvents(logging.Handler):
    """Log records as "log" events (the tray writes them to its log file)."""

    def emit(self, record: logging.LogRecord) -> None:
        emit(event="log", level=record.levelname, text=record.getMessage())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--fake", action="store_true")
    parser.add_argument("--hold-load", action="store_true")
    args = parser.parse_args()
    qapp = QApplication(sys.argv[:1])
    qapp.setQuitOnLastWindowClosed(False)

    from app.ui.app import TrayApp
    from app.ui.launch import parse_args
    from app.ui.controllers.instance_requests import InstanceRequests
    from app.ui.models import ModelEntry, open_backend
    from app.ui.platform.quit_signal import quit_on_sigterm
    from app.ui.single_instance import InstanceServer, claim_instance

    release_load = threading.Event()
    opener = open_backend
    if args.fake:
        from ui_fakes import FakeOpener

        opener = FakeOpener()
    if args.hold_load:
        def held_opener(entry, _open=opener, **kwargs):
            emit(event="loading")
            release_load.wait(120)
            return _open(entry, **kwargs)

        opener = held_opener
    tray = TrayApp(with_tray_icon=False, opener=opener)
    # What run_tray does too: other qwen-tray processes (`qwen-tray action`) reach this one.
    instance = claim_instance([])
    if instance is None:
        emit(event="not_started", reason="another tray runs with this QWEN_TRAY_HOME")
        return 1
    server = InstanceServer(instance, InstanceRequests(tray, parse_args).handle, parent=tray)
    for notice in tray.notices:
        emit(event="notice", text=notice)
    tray.notified.connect(lambda text: emit(event="notice", text=text))
    controller = tray.action_controller

    def answered(text: str) -> None:
        popup = controller.popup
        button = popup.replace_button
        centre = button.mapToGlobal(QPoint(button.width() // 2, button.height() // 2))
        # The popup only gets text through streamed deltas: equal text means the stream arrived whole.
        emit(event="answer", text=text, popup_text=popup.answer_text(), popup_visible=popup.isVisible(),
             replace=[centre.x(), centre.y()], replace_enabled=button.isEnabled(), status=popup.status.text(),
             source=popup.source.text())

    controller.answered.connect(answered)
    controller.started.connect(lambda captured: emit(event="captured", text=captured.text, origin=captured.origin))
    controller.popup.closed.connect(lambda _had_focus: emit(event="popup_closed"))
    controller._paster.finished.connect(lambda: emit(event="pasted"))
    tray.host.loaded.connect(lambda: emit(event="ready", model=tray.host.backend.name,
                                          hotkeys=tray.hotkeys.active, failures=tray.hotkeys.failures))
    tray.host.loadFailed.connect(lambda message: emit(event="load_failed", message=message))
    entry = ModelEntry(name="test model", kind="local", path=args.model or "/fake")
    tray.host.switch_to(entry)

    commands = Commands()
    commands.received.connect(lambda line: qapp.quit() if line == "quit" else None)

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "release-load":
                release_load.set()  # (the loader thread waits on it)
            else:
                commands.received.emit(line.strip())

    threading.Thread(target=read_stdin, daemon=True).start()
    qapp.aboutToQuit.connect(tray.shutdown)
    quit_on_sigterm(qapp)
    keeper_log = logging.getLogger("app.ui.platform.clipboard_keeper")
    keeper_log.addHandler(LogEvents())
    keeper_log.setLevel(logging.INFO)
    try:
        return qapp.exec()
    finally:
        server.close()


if __name__ == "__main__":
    sys.exit(main())
