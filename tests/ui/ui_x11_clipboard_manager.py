"""A clipboard manager for the X11 tests, as small as the freedesktop protocol allows (python-xlib).

It owns CLIPBOARD_MANAGER. When an application that owns the clipboard quits, Qt asks it for
SAVE_TARGETS: it then copies every target of the clipboard from that application, takes
CLIPBOARD itself and serves the copies, and answers the request (the application waits for that
answer before it ends). Events are JSON lines on stdout: ready, saved (the targets it keeps).
stdin: "quit".
"""

from __future__ import annotations

import json
import os
import sys
import threading

from Xlib import X, Xatom, display
from Xlib.protocol import event

NOT_CONTENT = ("TARGETS", "MULTIPLE", "TIMESTAMP", "SAVE_TARGETS")


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


class ClipboardManager:
    def __init__(self):
        self.d = display.Display()
        self.window = self.d.screen().root.create_window(0, 0, 1, 1, 0, X.CopyFromParent)
        self.atom = self.d.intern_atom
        self.saved: dict[int, tuple[int, int, bytes | list[int]]] = {}  # target: (type, format, data)
        self.window.set_selection_owner(self.atom("CLIPBOARD_MANAGER"), X.CurrentTime)
        self.d.sync()

    def fetch(self, target: int) -> tuple[int, int, bytes | list[int]] | None:
        """The clipboard's ``target`` from its owner; None when it refuses."""
        prop = self.atom("_MANAGER_FETCH")
        self.window.convert_selection(self.atom("CLIPBOARD"), target, prop, X.CurrentTime)
        self.d.flush()
        while True:
            e = self.d.next_event()
            if e.type == X.SelectionNotify and e.requestor == self.window:
                break
        if e.property == X.NONE:
            return None
        reply = self.window.get_full_property(prop, X.AnyPropertyType)
        self.window.delete_property(prop)
        return (reply.property_type, reply.format, reply.value) if reply is not None else None

    def save(self, request) -> None:
        targets = self.fetch(self.atom("TARGETS"))
        for target in targets[2] if targets is not None else ():
            if self.d.get_atom_name(target) not in NOT_CONTENT and (content := self.fetch(target)) is not None:
                self.saved[target] = content
        self.window.set_selection_owner(self.atom("CLIPBOARD"), X.CurrentTime)
        self.reply(request, request.property)
        emit(event="saved", targets=sorted(self.d.get_atom_name(t) for t in self.saved))

    def serve(self, request) -> None:
        if request.target == self.atom("TARGETS"):
            request.requestor.change_property(request.property, Xatom.ATOM, 32,
                                              [self.atom("TARGETS"), *self.saved])
        elif request.target in self.saved:
            kind, fmt, value = self.saved[request.target]
            request.requestor.change_property(request.property, kind, fmt, value)
        else:
            self.reply(request, X.NONE)
            return
        self.reply(request, request.property)

    def reply(self, request, prop: int) -> None:
        notify = event.SelectionNotify(time=request.time, requestor=request.requestor, selection=request.selection,
                                       target=request.target, property=prop)
        request.requestor.send_event(notify)
        self.d.flush()

    def run(self) -> None:
        emit(event="ready")
        while True:
            e = self.d.next_event()
            if e.type != X.SelectionRequest:
                continue
            if e.selection == self.atom("CLIPBOARD_MANAGER") and e.target == self.atom("SAVE_TARGETS"):
                self.save(e)
            elif e.selection == self.atom("CLIPBOARD"):
                self.serve(e)
            else:
                self.reply(e, X.NONE)


def quit_when_asked() -> None:
    """On "quit", or when the test's end of stdin closes (the X event loop never returns on its own)."""
    for line in sys.stdin:
        if line.strip() == "quit":
            break
    os._exit(0)


def main() -> int:
    manager = ClipboardManager()
    threading.Thread(target=quit_when_asked, daemon=True).start()
    manager.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
