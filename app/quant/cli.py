"""``qwen-tray quantize``: a Hugging Face folder (+ LoRA) -> a quantized checkpoint folder."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from app.errors import Interrupted
from app.quant.device import DEVICE_CHOICES
from app.quant.methods import DEFAULT_METHOD, METHOD_CHOICES


def register(sub) -> None:
    p = sub.add_parser(
        "quantize", help="quantize a model folder into a W4/W3 checkpoint",
        description="Quantize a Hugging Face model folder (Qwen2 / Llama) into a layered W4/W3 checkpoint, "
                    "one layer at a time. Run the same command again to resume an interrupted run.")
    p.add_argument("--model", required=True, metavar="NAME|DIR",
                   help="the source model: a registered model's name or a Hugging Face model folder")
    p.add_argument("--adapter", type=Path, metavar="LORA_DIR", help="a PEFT LoRA adapter to merge first")
    p.add_argument("--recipe", required=True, metavar="RECIPE",
                   help="w4, mixed, q4 or a .toml/.json recipe file (docs/FORMATS.md)")
    p.add_argument("--method", choices=METHOD_CHOICES, default=DEFAULT_METHOD,
                   help="gptq (default): error-compensating quantization from the calibration text's activations; "
                        "calibrated: clipping search weighted by the same activations; search: the search without "
                        "calibration; rtn: round to nearest; awq: calibrated + AWQ column scaling "
                        "(docs/results/quality.md compares them)")
    p.add_argument("--calibration", type=Path, metavar="TEXT_FILE",
                   help="calibration text for gptq/calibrated/awq (default: the mixed English/Chinese prose "
                        "shipped in app/resources/text/calibration.txt)")
    p.add_argument("--calibration-tokens", type=int, default=2048, metavar="N", help="tokens of it to use (default 2048)")
    p.add_argument("--sequential", action="store_true",
                   help="gptq: each layer calibrated on what the already-quantized layers before it output "
                        "(measured better with a `recipe sensitive` recipe, worse with w4 and mixed)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                   help="where the clipping search and GPTQ run (default auto: the GPU when it has room, else the CPU)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="the checkpoint folder to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported when the command runs, not when it is registered: `qwen-tray --help` needs no torch
    from dataclasses import replace

    from app.errors import QwenTrayError
    from app.formats.recipe import load_recipe
    from app.quant.device import resolve_quantize_device
    from app.quant.quantizer import GPTQ_SETTINGS, QuantizeJob
    from app.settings.console import locate_model

    if args.sequential and args.method != "gptq":
        raise QwenTrayError(f"--sequential is a setting of --method gptq, not of {args.method}")
    source = locate_model(args.model)
    job = QuantizeJob(model=source.path, model_id=source.name, out=args.out, recipe=load_recipe(args.recipe),
                      method=args.method, adapter=args.adapter, calibration=args.calibration,
                      calibration_tokens=args.calibration_tokens,
                      device=resolve_quantize_device(args.device, source.path, args.method),
                      gptq=replace(GPTQ_SETTINGS, sequential=args.sequential))
    quantize_with_progress(job, source.name)
    return 0


def quantize_with_progress(job, label: str, *, registers: bool = False):
    """Run ``job`` with a progress bar on stderr (in a log: a line per tenth of the files) and
    print one summary line; return the manifest. Ctrl+C says what stays in ``job.out``
    (``registers``: the command would have registered the checkpoint)."""
    from app.progress import LOG_STEPS, load_progress_bar
    from app.quant.quantizer import quantize_model  # lazily: `qwen-tray --help` imports this module

    started = time.perf_counter()
    try:
        with load_progress_bar(f"quantizing {label}", delay=0, steps=LOG_STEPS) as progress:
            manifest = quantize_model(job, progress, on_resume=_say_resuming)
    except KeyboardInterrupt:
        raise Interrupted(stopped_quantizing(job.out, registers)) from None
    print(f"wrote {job.out}: recipe {manifest.recipe.name}, method {manifest.method}, "
          f"{manifest.total_bytes / 2**30:.3f} GiB, {manifest.bits_per_weight:.3f} bits/weight "
          f"in {time.perf_counter() - started:.1f} s")
    return manifest


def _say_resuming(done: int, total: int) -> None:
    print(f"resuming: {done} of {total} files are already done", file=sys.stderr, flush=True)


def stopped_quantizing(out: Path, registers: bool) -> str:
    """What Ctrl+C left of a quantization into ``out``: its finished files stay for the next run
    (the journal; a file being written was removed), and without a manifest nothing loads it."""
    finished = len(list(out.glob("*.safetensors"))) if out.is_dir() else 0
    nothing = "nothing was registered and " if registers else ""
    if finished == 0:
        return f"stopped before the first layer was finished: {nothing}running the same command starts again"
    return (f"stopped: {nothing}{out} is not a usable checkpoint yet (no manifest); its {finished} finished "
            f"{'file is' if finished == 1 else 'files are'} kept and running the same command resumes from them")
