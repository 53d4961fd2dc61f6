"""``qwen-tray`` without a subcommand: the tray process's start — its arguments, the single
instance, the log file, the Qt application and the event loop around a :class:`TrayApp`."""

from __future__ import annotations

import argparse
import logging
import sys

from PySide6.QtWidgets import QApplication, QSystemTrayIcon

from app.paths import log_file
from app.settings.preferences import LANGUAGES, language_option
from app.ui.app import TrayApp
from app.ui.controllers.instance_requests import InstanceRequests
from app.ui.file_log import FileLogHandler, LogFileStream
from app.ui.platform.quit_signal import quit_on_sigterm
from app.ui.single_instance import InstanceLock, InstanceServer, claim_instance
from app.ui.widgets.icons import app_icon

log = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qwen-tray", description="Qwen Tray desktop assistant (tray app)")
    parser.add_argument("--model", help="load this model folder instead of the configured one")
    parser.add_argument("--language", choices=LANGUAGES, type=language_option,
                        help="UI language for this run (zh is zh_CN)")
    parser.add_argument("--replace", action="store_true", help="quit the running Qwen Tray and start this one")
    return parser.parse_args(argv)


def _log_to_file() -> logging.Handler:
    """The tray runs without a console (pythonw on Windows): keep a log under the data folder."""
    log_file().parent.mkdir(parents=True, exist_ok=True)
    handler = FileLogHandler(log_file())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    # Under pythonw the CLI's stand-in for the missing stderr writes to this same file
    # (app.commands.console_streams): its handler would put every record in twice.
    for duplicate in [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                      and isinstance(h.stream, LogFileStream)]:
        root.removeHandler(duplicate)
    root.addHandler(handler)
    root.setLevel(min(root.level, logging.INFO) if root.level else logging.INFO)
    return handler


def run_tray(argv: list[str], instance: InstanceLock | None = None) -> int:
    """Start the tray app; returns the exit status. ``instance``: the single-instance lock, when
    the caller claimed it; else it is claimed here (a running tray takes ``argv`` instead)."""
    args = parse_args(argv)
    instance = instance or claim_instance([a for a in argv if a != "--replace"], replace=args.replace)
    if instance is None:
        return 0
    log_handler = _log_to_file()
    try:
        return _run_tray(args, instance)
    finally:
        instance.release()  # (also when it failed to start: the next start must not wait for it)
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()


def _run_tray(args: argparse.Namespace, instance: InstanceLock) -> int:
    qapp = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "qwen-tray"])
    qapp.setApplicationName("qwen-tray")
    qapp.setQuitOnLastWindowClosed(False)  # closing the chat window keeps the tray running
    qapp.setWindowIcon(app_icon())
    has_tray = QSystemTrayIcon.isSystemTrayAvailable()  # not on GNOME without its AppIndicator extension
    tray_app = TrayApp(language=args.language, with_tray_icon=has_tray)
    if args.model:
        tray_app.switch_to_named(args.model)
    else:
        tray_app.start()
    if not has_tray:
        log.warning("no system tray found: the chat window carries the menu, and closing it quits")
        tray_app.open_chat()  # something to see: started from a menu, it would run invisibly
    qapp.aboutToQuit.connect(tray_app.shutdown)
    quit_on_sigterm(qapp)  # `kill` quits like the menu's Quit (the default would skip the shutdown)
    # Other qwen-tray commands (a second start, `qwen-tray action`) are answered from here on.
    server = InstanceServer(instance, InstanceRequests(tray_app, parse_args).handle, parent=tray_app)
    try:
        return qapp.exec()
    finally:
        server.close()
