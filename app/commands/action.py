"""``qwen-tray action NAME [--text TEXT | -]``: run an action in the running tray.

Without text the tray copies the selection of the focused window, as the action's hotkey would;
with ``--text`` or ``-`` (standard input) it works on that text. The answer streams into the
tray's popup. This is what a desktop's own shortcut calls where the tray cannot grab global
hotkeys (Wayland), or a launcher on Windows and macOS (README: "Actions from a shortcut").
``qwen-tray action --list`` lists the actions from the settings; it needs no running tray.
"""

from __future__ import annotations

import argparse

from app.commands import text_input
from app.errors import QwenTrayError, pip_install_extra
from app.settings.actions import Action, find_action
from app.settings.console import console_store
from app.ui.actions import load_builtin_actions, with_unique_ids

NOT_RUNNING = "Qwen Tray is not running: start it first (`qwen-tray`); `qwen-tray action --list` works without it"


def register(sub) -> None:
    p = sub.add_parser("action", help="run an action in the running tray (on the selection, or on given text)",
                       description="Run an action in the running tray app, as its hotkey would: on the selection "
                       "of the focused window, or on the given text. The answer shows in the tray's popup.")
    p.add_argument("name", metavar="NAME", nargs="?", help="the action's id or its name (see --list)")
    given = p.add_mutually_exclusive_group()
    given.add_argument("--text", metavar="TEXT", help="work on TEXT instead of the selection")
    given.add_argument("stdin", metavar="-", nargs="?", choices=("-",), help="work on the text read from standard input")
    p.add_argument("--list", action="store_true", help="list the actions (works without a running tray)")
    p.set_defaults(func=run)


def configured_actions() -> list[Action]:
    """The built-in actions and the user's own, as the tray has them (a clashing id renamed)."""
    builtin = load_builtin_actions()
    user, _renamed = with_unique_ids(console_store().load().actions, builtin)
    return [*builtin, *user]


def run(args: argparse.Namespace) -> int:
    actions = configured_actions()
    if args.list:
        return print_actions(actions)
    if not args.name:
        raise QwenTrayError("name an action (`qwen-tray action --list` shows them)")
    action = find_action(actions, args.name)
    text = text_input.from_stdin() if args.stdin == "-" else (
        None if args.text is None else text_input.from_argument(args.text))
    if text is not None and not text.strip():
        raise QwenTrayError("the text to work on is empty")
    try:
        from app.ui.single_instance import QUEUED_REPLY_TIMEOUT_MS, InstanceLock, hand_foreground_to, request_running
    except ImportError as e:
        raise QwenTrayError(f"the tray app needs PySide6 ({e.name} is missing): {pip_install_extra('ui')}") from None
    # A tray still loading its model answers once the load is over (a shortcut pressed right after login).
    lock = InstanceLock()
    hand_foreground_to(lock)  # its popup shows the answer: in front, with the keyboard
    reply = request_running({"command": "action", "id": action.id, "text": text}, lock,
                            reply_timeout_ms=QUEUED_REPLY_TIMEOUT_MS)
    if reply is None:
        raise QwenTrayError(NOT_RUNNING)
    if not reply.get("ok"):
        raise QwenTrayError(str(reply.get("error")))
    print(reply.get("message", ""))
    return 0


def print_actions(actions: list[Action]) -> int:
    hotkeys = console_store().load().preferences.hotkeys
    width = max(len(a.id) for a in actions)
    for action in actions:
        hotkey = hotkeys.get(action.id, action.hotkey)
        name = f"{action.name} / {action.name_zh}" if action.name_zh else action.name
        print(f"{action.id:<{width}}  {name}" + (f"  [{hotkey}]" if hotkey else ""))
    return 0
