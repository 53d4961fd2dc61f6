"""What another ``qwen-tray`` process asks of the running tray (app/ui/single_instance.py).

- ``activate``: a second ``qwen-tray`` was started: open the chat window, or with ``--model``
  switch to that model, instead of a second tray;
- ``action``: ``qwen-tray action NAME [--text TEXT | -]`` runs an action as its hotkey would
  (on the selection, or on the given text), streaming into the popup; sent while the model
  loads (a desktop shortcut pressed right after login), it waits for the load and is answered
  then: it ran, or the load's error (at most QUEUED_ACTION_LIMIT_S);
- ``quit``: ``qwen-tray --replace``; ``ping``: is it up.

Each answer is one sentence (English, like the CLI) for the other process to print.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from PySide6.QtCore import QTimer

from app.settings.actions import ActionError, find_action
from app.ui.i18n import current_language, resolve_language, tr
from app.ui.single_instance import QUEUED_ACTION_LIMIT_S, PendingReply

if TYPE_CHECKING:
    from app.ui.app import TrayApp


def ok(message: str) -> dict:
    return {"ok": True, "message": message, "pid": os.getpid()}


def refused(error: str) -> dict:
    return {"ok": False, "error": error, "pid": os.getpid()}


class InstanceRequests:
    def __init__(self, app: TrayApp, parse_args):
        self.app = app
        self._parse_args = parse_args  # the tray's own argument parser (app.ui.launch.parse_args)

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
            return ok(f"it is loading {args.model}{self._language_note(args.language)}")
        self.app.open_chat()
        return ok(f"it opened its chat window{self._language_note(args.language)}")

    @staticmethod
    def _language_note(asked: str | None) -> str:
        """The UI's language is chosen at start (its windows are not translated again): say so
        rather than ignore ``--language``."""
        if asked is None or resolve_language(asked) == current_language():
            return ""
        names = {"en": "English", "zh_CN": "Simplified Chinese"}
        return (f"; it keeps its language ({names[current_language()]}): "
                f"`qwen-tray --language {asked} --replace` restarts it in {names[resolve_language(asked)]}")

    def _action(self, action_id: object, text: object) -> dict:
        if not isinstance(action_id, str) or (text is not None and not isinstance(text, str)):
            return refused("an action request needs an action id (or name) and optionally a text")
        try:
            action = find_action(self.app.actions, action_id)  # an id, or a name another client sent
        except ActionError as e:
            return refused(str(e))
        if text is not None and not text.strip():
            return refused("the text to work on is empty")
        if self.app.host.backend is None and self.app.host.state == "loading":
            return self._after_the_load(action.id, action.name, text)
        if self.app.host.backend is None:
            return refused(f"no model is ready yet ({self._model_state()})")
        return self._run(action.id, action.name, text)

    def _run(self, action_id: str, name: str, text: str | None) -> dict:
        self.app.run_action(action_id, text)
        return ok(self._runs_on(name, text))

    @staticmethod
    def _runs_on(name: str, text: str | None) -> str:
        where = "the selection" if text is None else "the given text"
        return f"{name} runs on {where}; the answer shows in its popup"

    def _after_the_load(self, action_id: str, name: str, text: str | None) -> PendingReply:
        """Start the action now (the selection is copied now, not when the load ends: by then the
        user may have moved on); answer once the model is ready and the action runs, or the load failed."""
        self.app.run_action(action_id, text)
        pending = PendingReply(self.app)
        host = self.app.host
        limit = QTimer(pending, singleShot=True, interval=QUEUED_ACTION_LIMIT_S * 1000)

        def answer(reply: dict) -> None:
            host.loaded.disconnect(on_loaded)
            host.loadFailed.disconnect(on_failed)
            limit.stop()
            pending.ready.emit(reply)
            pending.deleteLater()

        def on_loaded() -> None:
            answer(ok(self._runs_on(name, text)))

        def on_timeout() -> None:
            self.app.action_controller.cancel_wait()
            answer(refused(f"the model was still loading after {QUEUED_ACTION_LIMIT_S // 60} minutes, so {name} "
                           f"did not run ({self._model_state()})"))

        def on_failed(message: str) -> None:
            answer(refused(f"the model could not be loaded, so {name} did not run: {message}"))

        host.loaded.connect(on_loaded)
        host.loadFailed.connect(on_failed)
        limit.timeout.connect(on_timeout)
        limit.start()
        model = host.entry.name if host.entry else ""
        self.app.notify(tr("{action} runs once {model} is loaded", action=name, model=model))
        return pending
