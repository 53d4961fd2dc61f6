"""The user's application in the X11 end-to-end test: a text field holding selected text.

It also owns the user's clipboard at the start (plain text and HTML), like an editor the
user copied from. Commands on stdin: "text" prints the field's text; "quit" exits.
Events are JSON lines on stdout.
"""

from __future__ import annotations

import json
import sys
import threading

from PySide6.QtCore import QMimeData, QObject, Signal
from PySide6.QtWidgets import QApplication, QPlainTextEdit

SELECTED = "The quarterly planning meeting moved from Tuesday to Friday at 3 pm. Alice will send the new slides."
CLIPBOARD_TEXT = "the user's clipboard: order #12345"
CLIPBOARD_HTML = "<p>the user's clipboard: <b>order #12345</b></p>"


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


class Commands(QObject):
    received = Signal(str)


def main() -> int:
    app = QApplication(sys.argv[:1])
    field = QPlainTextEdit()
    field.setWindowTitle("target editor")
    field.setPlainText(SELECTED)
    field.selectAll()
    field.resize(500, 200)
    field.move(40, 40)
    field.show()
    field.activateWindow()
    field.setFocus()
    mime = QMimeData()
    mime.setText(CLIPBOARD_TEXT)
    mime.setHtml(CLIPBOARD_HTML)
    app.clipboard().setMimeData(mime)

    commands = Commands()

    def handle(line: str) -> None:
        if line == "text":
            emit(event="text", text=field.toPlainText())
        elif line == "quit":
            app.quit()

    commands.received.connect(handle)
    threading.Thread(target=lambda: [commands.received.emit(line.strip()) for line in sys.stdin], daemon=True).start()
    app.processEvents()
    emit(event="ready", wid=int(field.winId()))
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
