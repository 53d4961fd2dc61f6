"""What another ``qwen-tray`` process asks of the running tray (app/ui/single_instance.py).

- ``activate``: a second ``qwen-tray`` was started: open the chat window, or with ``--model``
  switch to that model, instead of a second tray;
- ``action``: ``qwen-tray action NAME [--text TEXT | -]`` runs an action as its hotkey would
  (on the selection, or on the given text), streaming into the popup;
- ``quit``: ``qwen-tray --replace``; ``ping``: is it up.

Each answer is one sentence (English, like the CLI) for the other process to print.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer


if TYPE_CHECKING:
    from app.ui.app import TrayApp


def ok(message: str) -> dict:
    return {"ok": True, "message": message, "pid": os.getpid()}


def refused(error: str) -> dict:
    return {"ok": False, "error": error, "pid": os.getpid()}


class InstanceRequests:
    def __init__(self, app: TrayApp, parse_args):
        self.app = app
        self._parse_args = parse_args  # the tray's own argument parser (app.ui.app.parse_args)

    def handle(self, request: dict) -> dict:
        command = request.get("command")
        if command == "ping":
            return ok(f"model {self._model_state()}")
        if command == "activate":
            return self._activate(request.get("argv", []))
        if command == "action":
            return self._action(request.get("id"), request.get("text"))
        if command == "quit":
            QTimer.singleShot(0, self.app.quit)  # after the reply went out
            return ok("it is quitting")
        return refused(f"unknown request {command!r}")

    def _model_state(self) -> str:
        host = self.app.host
        name = host.entry.name if host.entry else "none"
        return f"{name}: {host.state}"

    def _activate(self, argv: object) -> dict:
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            return refused("argv must be a list of strings")
        try:
            args = self._parse_args(argv)
        except SystemExit:
            return refused(f"bad arguments: {' '.join(argv)}")
        if args.model:
            self.app.switch_to_named(args.model)
            return ok(f"it is loading {args.model}")
        self.app.open_chat()
        return ok("it opened its chat window")

    def _action(self, action_id: object, text: object) -> dict:
        if not isinstance(action_id, str) or (text is not None and not isinstance(text, str)):
            return refused("an action request needs an action id and optionally a text")
        action = next((a for a in self.app.actions if a.id == action_id), None)
        if action is None:
            return refused(f"there is no action {action_id!r} (`qwen-tray action --list` shows them)")
        if self.app.host.backend is None:
            return refused(f"no model is ready yet ({self._model_state()})")
        if text is not None and not text.strip():
            return refused("the text to work on is empty")
        self.app.run_action(action_id, text)
        where = "the selection" if text is None else "the given text"
        return ok(f"{action.name} runs on {where}; the answer shows in its popup")
