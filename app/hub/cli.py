"""``qwen-tray models catalog`` and ``qwen-tray models get NAME`` (registered by app/commands/models.py)."""

from __future__ import annotations

import argparse
import sys

from app.hub.progress import DOWNLOADING, QUANTIZING, VERIFYING, JobProgress, format_bytes
from app.quant.cli import DEFAULT_METHOD, METHOD_CHOICES


def register(models_sub) -> None:
    catalog = models_sub.add_parser(
        "catalog", help="list the models `models get` can download, their sizes and whether they fit this machine",
        description="List the recommended models: download size, checkpoint size, and where the tray would run "
                    "each on this machine (the VRAM planner of `qwen-tray doctor`).")
    catalog.set_defaults(func=run_catalog)
    get = models_sub.add_parser(
        "get", help="download a catalog model, quantize it and register it (run it again to resume)",
        description="Download a model from the catalog (Hugging Face, a mirror through HF_ENDPOINT or --endpoint, "
                    "or ModelScope), quantize it into a checkpoint for the GPU and register it. Interrupted? Run "
                    "the same command again: the download and the quantization resume.")
    get.add_argument("name", metavar="NAME", help="a name from `qwen-tray models catalog`")
    get.add_argument("--source", choices=("hf", "modelscope"), default="hf",
                     help="hf: the Hugging Face Hub or its mirror (default); modelscope: ModelScope")
    get.add_argument("--endpoint", metavar="URL", help="another endpoint for the source, e.g. a Hugging Face mirror "
                     "such as https://hf-mirror.com (default: HF_ENDPOINT / MODELSCOPE_ENDPOINT or the official site)")
    get.add_argument("--recipe", metavar="RECIPE", help="w4, mixed, q4 or a recipe file (default: the catalog's)")
    get.add_argument("--method", choices=METHOD_CHOICES, default=DEFAULT_METHOD,
                     help=f"quantization method (default {DEFAULT_METHOD}; see `qwen-tray quantize --help`)")
    get.add_argument("--device", choices=("cpu", "cuda"), help="where to quantize (default: the GPU when it has "
                     "room, else the CPU)")
    get.add_argument("--keep-source", action="store_true", help="keep the downloaded 16-bit model folder")
    get.add_argument("--default", action="store_true", help="make it the default model")
    get.add_argument("--replace", action="store_true",
                     help="point the name at this model even if it is registered to another one")
    get.set_defaults(func=run_get)


def run_catalog(args: argparse.Namespace) -> int:
    from app.engine.cuda.fit import Machine
    from app.hub.catalog import load_catalog
    from app.hub.plan import plan_entry

    machine = Machine.detect()
    for entry in load_catalog():
        plan = plan_entry(entry, machine)
        sizes = (f"download {format_bytes(plan.download_bytes)}, checkpoint {format_bytes(plan.checkpoint_bytes)}"
                 if plan.download_bytes is not None else "sizes unknown (no [config] in its entry)")
        print(f"{entry.name}  (recipe {plan.recipe}; {sizes})")
        if plan.fit is not None:
            print(f"    this machine: {plan.fit.text}")
        sources = ", ".join(f"{s}: {ref.repo}" for s, ref in entry.sources.items())
        print(f"    {sources}" + (f"; license {entry.license}" if entry.license else ""))
    print("get one with: qwen-tray models get NAME [--source hf|modelscope] [--recipe R] [--keep-source]")
    return 0


def run_get(args: argparse.Namespace) -> int:
    from app.engine.cuda.fit import Machine
    from app.hub.catalog import find_entry
    from app.hub.job import GetModelJob
    from app.settings.console import console_store

    job = GetModelJob(find_entry(args.name), source=args.source, recipe=args.recipe, method=args.method,
                      keep_source=args.keep_source, make_default=args.default, endpoint=args.endpoint,
                      device=args.device, machine=Machine.detect(), replace=args.replace, store=console_store())
    with TqdmReporter() as report:
        got = job.run(report)
    default = " (default)" if got.is_default else ""
    print(f"{got.name}{default}: {got.path}")
    if got.fit is not None:
        print(f"the tray runs it {got.fit.text}")
    if got.source_kept is not None:
        print(f"source kept in {got.source_kept}")
    return 0


class TqdmReporter:
    """Draws a job's progress on stderr: one tqdm bar per stage (bytes with speed and ETA for the
    download, whose checksums show on its bar; layers for the quantizer); silent when stderr is not
    a terminal."""

    _UNITS = {DOWNLOADING: "B", VERIFYING: "B", QUANTIZING: "layer"}

    def __init__(self):
        self.bar = None
        self.stage = None

    def __enter__(self) -> TqdmReporter:
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def __call__(self, progress: JobProgress) -> None:
        from tqdm import tqdm

        if progress.stage == VERIFYING and self.stage == DOWNLOADING:
            self.bar.set_postfix_str(f"checking {progress.detail}")  # one bar for the whole download
            return
        if progress.stage != self.stage:
            self._close()
            self.stage = progress.stage
            if not progress.total and progress.stage not in self._UNITS:
                return  # a short step (checking, registering): no bar
            unit = self._UNITS.get(progress.stage, progress.unit or "it")
            self.bar = tqdm(desc=progress.stage, total=progress.total or None, unit=unit, unit_scale=unit == "B",
                            unit_divisor=1024, file=sys.stderr, disable=None, initial=progress.done)
        if self.bar is None:
            return
        if progress.total and self.bar.total != progress.total:
            self.bar.total = progress.total
        self.bar.n = progress.done
        if progress.detail:
            self.bar.set_postfix_str(progress.detail, refresh=False)
        self.bar.refresh()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
