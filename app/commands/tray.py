"""``qwen-tray tray`` (and ``qwen-tray`` alone): start the desktop tray app."""

from __future__ import annotations

import argparse

from app.commands.display import display_problem
from app.errors import QwenTrayError, pip_install_extra
from app.settings.preferences import LANGUAGES, language_option


def register(sub) -> None:
    p = sub.add_parser("tray", help="start the tray app (the default with no command)",
                       description="Start the desktop tray app: hotkey actions, chat window, local API.")
    p.add_argument("--model", metavar="NAME|PATH",
                   help="load this registered model (or model folder) instead of the configured one")
    # SUPPRESS: no default of its own, so `qwen-tray --language zh_CN tray` keeps the top-level choice.
    p.add_argument("--language", choices=LANGUAGES, type=language_option, default=argparse.SUPPRESS,
                   help="UI language for this run (zh is zh_CN)")
    # dest: not "replace", which `models add/get --replace` use for another meaning
    p.add_argument("--replace", dest="tray_replace", action="store_true", default=argparse.SUPPRESS,
                   help="quit the running Qwen Tray and start this one")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    argv = []
    if getattr(args, "model", None):
        argv += ["--model", _model_to_hand_over(args.model)]
    if getattr(args, "language", None):
        argv += ["--language", args.language]
    try:
        from app.ui.single_instance import claim_instance
    except ImportError as e:
        raise QwenTrayError(f"the tray app needs PySide6 ({e.name} is missing): {pip_install_extra('ui')}") from None
    # A running tray takes the arguments (no display needed for that); else this one starts.
    instance = claim_instance(argv, replace=getattr(args, "tray_replace", False))
    if instance is None:
        return 0
    problem = display_problem()
    if problem is not None:
        instance.release()
        raise QwenTrayError(problem)
    try:
        from app.ui.launch import run_tray
    except ImportError as e:
        instance.release()
        raise QwenTrayError(f"the tray app needs PySide6 ({e.name} is missing): {pip_install_extra('ui')}") from None
    return run_tray(argv, instance)


def _model_to_hand_over(name_or_path: str) -> str:
    """A registered name as it is, else the folder checked here and made absolute: the tray that
    takes it may be another process, started in another folder."""
    from app.settings.console import console_store

    settings = console_store().load()
    if settings.model(name_or_path) is not None:
        return name_or_path
    folder = settings.resolve_model(name_or_path).resolve()
    if not folder.is_dir():
        raise QwenTrayError(f"{name_or_path}: not a folder (give the model's folder, or a registered model's name)")
    return str(folder)
