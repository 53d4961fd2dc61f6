"""The user's application in the X11 end-to-end tests: a text field holding selected text.

It owns the user's clipboard at the start (plain text and HTML), like an editor the user
copied from. ``--wm-class INSTANCE,CLASS`` gives its window a terminal's WM_CLASS;
``--copy-keys`` says which keys copy its selection: "ctrl+c" (an editor), "ctrl+shift+c" (a
terminal) or "none" (xterm: selected text is only in the PRIMARY selection). A terminal
reports every Ctrl+C it receives ("ctrl_c" event) and swallows it, as a shell would take it
as an interrupt.

Commands on stdin (each answered with an "ok" event once done): "select TEXT" puts TEXT in
the field and selects it (and in PRIMARY, as X11 applications do); "clip-text TEXT" and
"clip-image" put other content on the clipboard; "text" prints the field's text; "quit".
Events are JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt, Signal
from PySide6.QtGui import QClipboard, QImage, QKeyEvent
from PySide6.QtWidgets import QApplication, QPlainTextEdit

SELECTED = "The quarterly planning meeting moved from Tuesday to Friday at 3 pm. Alice will send the new slides."
CLIPBOARD_TEXT = "the user's clipboard: order #12345"
CLIPBOARD_HTML = "<p>the user's clipboard: <b>order #12345</b></p>"


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


class Commands(QObject):
    received = Signal(str)


class CopyKeys(QObject):
    """The application's own copy keys; Ctrl+C in a terminal is reported and swallowed."""

    def __init__(self, field: QPlainTextEdit, copy_keys: str):
        super().__init__(field)
        self.field, self.copy_keys = field, copy_keys

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt)
        if event.type() not in (QEvent.KeyPress, QEvent.ShortcutOverride) or not isinstance(event, QKeyEvent):
            return False
        # Meta (Super) too: an application takes Super+Ctrl+C for another shortcut, not for copy.
        mods = event.modifiers() & (Qt.ControlModifier | Qt.ShiftModifier | Qt.AltModifier | Qt.MetaModifier)
        if event.key() != Qt.Key_C or not mods & Qt.ControlModifier:
            return False
        if event.type() == QEvent.ShortcutOverride:
            event.accept()  # the key press comes to us, not to a shortcut
            return True
        pressed = "ctrl+shift+c" if mods == Qt.ControlModifier | Qt.ShiftModifier else \
            "ctrl+c" if mods == Qt.ControlModifier else "other"
        if pressed == "ctrl+c" and self.copy_keys != "ctrl+c":
            emit(event="ctrl_c")
        if pressed == self.copy_keys:
            QApplication.clipboard().setText(self.field.textCursor().selectedText())
        return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wm-class", default="ui_x11_target,Ui_x11_target")
    parser.add_argument("--copy-keys", choices=("ctrl+c", "ctrl+shift+c", "none"), default="ctrl+c")
    args = parser.parse_args()
    instance, wm_class = args.wm_class.split(",")
    app = QApplication([instance])  # Qt's WM_CLASS: argv[0] and the application name
    app.setApplicationName(wm_class)
    field = QPlainTextEdit()
    field.setWindowTitle("target editor")
    field.installEventFilter(CopyKeys(field, args.copy_keys))
    field.resize(500, 200)
    field.move(40, 40)

    def select(text: str) -> None:
        field.setPlainText(text)
        field.selectAll()
        app.clipboard().setText(text, QClipboard.Selection)

    select(SELECTED)
    field.show()
    field.activateWindow()
    field.setFocus()
    mime = QMimeData()
    mime.setText(CLIPBOARD_TEXT)
    mime.setHtml(CLIPBOARD_HTML)
    app.clipboard().setMimeData(mime)

    def handle(line: str) -> None:
        command, _, rest = line.partition(" ")
        if command == "text":
            emit(event="text", text=field.toPlainText())
        elif command == "select":
            select(rest)
            emit(event="ok")
        elif command == "clip-text":
            app.clipboard().setText(rest)
            emit(event="ok")
        elif command == "clip-image":
            image = QImage(16, 16, QImage.Format_RGB32)
            image.fill(0xFF336699)
            app.clipboard().setImage(image)
            emit(event="ok")
        elif command == "quit":
            app.quit()

    commands = Commands()
    commands.received.connect(handle)
    threading.Thread(target=lambda: [commands.received.emit(line.strip()) for line in sys.stdin], daemon=True).start()
    app.processEvents()
    emit(event="ready", wid=int(field.winId()))
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
