"""``qwen-tray recipe sensitive``: measure a model's sensitivity and write a recipe that spends
the base recipe's byte budget where it matters (app/quant/sensitivity.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.quant.device import DEVICE_CHOICES
from app.quant.methods import DEFAULT_METHOD, SENSITIVITY_METHODS


def register(sub) -> None:
    p = sub.add_parser("recipe", help="make quantization recipes from measurements",
                       description="Make quantization recipes from measurements.")
    rsub = p.add_subparsers(dest="recipe_command", metavar="ACTION", required=True)
    s = rsub.add_parser(
        "sensitive", help="write a recipe that gives 4 bits to the most sensitive units within a byte budget",
        description="Stream the calibration text through the model, measure how much each layer's q/k/v, o, "
                    "gate/up and down lose at 3 bits instead of 4, and write an explicit recipe (JSON) that "
                    "gives 4 bits to the most sensitive ones within the budget. Quantize with it: "
                    "qwen-tray quantize --recipe FILE.json")
    s.add_argument("--model", required=True, metavar="NAME|DIR",
                   help="the source model: a registered model's name or a Hugging Face model folder")
    s.add_argument("--base", default="mixed", metavar="RECIPE",
                   help="recipe whose size is the budget and whose embedding/head bits are kept (default: mixed)")
    s.add_argument("--budget-gib", type=float, metavar="GIB", help="weights budget (default: the base recipe's size)")
    s.add_argument("--calibration", type=Path, metavar="TEXT_FILE", help="calibration text (default: the shipped one)")
    s.add_argument("--calibration-tokens", type=int, default=2048, metavar="N", help="tokens of it to use (default 2048)")
    s.add_argument("--method", choices=SENSITIVITY_METHODS, default=DEFAULT_METHOD,
                   help=f"the method you will quantize with, whose errors rank the units (default: {DEFAULT_METHOD})")
    s.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                   help="where the measurement runs (default auto: the GPU when it has room, else the CPU)")
    s.add_argument("--out", required=True, type=Path, metavar="FILE.json", help="the recipe file to write")
    s.set_defaults(func=run_sensitive)


def run_sensitive(args: argparse.Namespace) -> int:
    from app.errors import ModelLoadError, QwenTrayError
    from app.progress import LOG_STEPS, load_progress_bar
    from app.quant import sensitivity
    from app.quant.device import resolve_quantize_device
    from app.formats.recipe import load_recipe
    from app.settings.console import locate_model

    source = locate_model(args.model)
    if not (source.path / "config.json").is_file():
        raise ModelLoadError(f"{source.path}: not a model folder (no config.json)")
    if args.out.suffix.lower() != ".json":
        raise QwenTrayError(f"{args.out}: --out must be a .json file")
    base = load_recipe(args.base)
    budget = int(args.budget_gib * 2**30) if args.budget_gib is not None else None
    shapes = sensitivity.model_shapes(source.path)
    sensitivity.check_budget(base, shapes, budget)  # before hours of measuring
    # a bar on a terminal, a line per tenth of the layers in a log (a 7B on the CPU takes long)
    with load_progress_bar(f"measuring {source.name}", delay=0, steps=LOG_STEPS) as report:
        def progress(done: int, total: int) -> None:
            report(f"layer {done}", done, total)

        device = resolve_quantize_device(args.device, source.path, args.method)
        units = sensitivity.measure(source.path, args.calibration, args.calibration_tokens, device, progress,
                                    method=args.method)
    recipe, summary = sensitivity.allocate(units, base, shapes, budget,
                                           name=f"{source.name}-{base.name}-sensitive")
    provenance = {**summary, "model": source.name, "method": args.method,
                  "calibration": str(args.calibration or "shipped"),
                  "calibration_tokens": args.calibration_tokens}
    sensitivity.write_recipe(args.out, recipe, provenance)
    print(f"wrote {args.out}: {summary['units_at_4_bits']} of {summary['units']} units at 4 bits, "
          f"{summary['total_bytes'] / 2**30:.3f} GiB of a {summary['budget_bytes'] / 2**30:.3f} GiB budget")
    sequential = " --sequential" if args.method == "gptq" else ""  # 3-bit attention gains from it (FORMATS.md)
    print(f"quantize with it: qwen-tray quantize --model {args.model} --recipe {args.out} --method {args.method}"
          f"{sequential} --out DIR")
    return 0
