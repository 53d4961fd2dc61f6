"""``qwen-tray models catalog`` and ``qwen-tray models get NAME`` (registered by app/commands/models.py)."""

from __future__ import annotations

import argparse
import sys

from app.errors import Interrupted, QwenTrayError
from app.hub.endpoint import endpoint_problem, normalize_endpoint
from app.hub.errors import HubUnreachableError
from app.hub.progress import QUANTIZING, REGISTERING, JobProgress, format_size_gb
from app.progress import format_bytes
from app.quant.device import DEVICE_CHOICES
from app.quant.methods import DEFAULT_METHOD, METHOD_CHOICES


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
    get.add_argument("--endpoint", metavar="URL", type=endpoint_url, help="another endpoint for the source, e.g. a Hugging Face mirror "
                     "such as https://hf-mirror.com (default: HF_ENDPOINT / MODELSCOPE_ENDPOINT or the official site)")
    get.add_argument("--recipe", metavar="RECIPE", help="w4, mixed, q4 or a recipe file (default: the catalog's)")
    get.add_argument("--method", choices=METHOD_CHOICES, default=DEFAULT_METHOD,
                     help=f"quantization method (default {DEFAULT_METHOD}; see `qwen-tray quantize --help`)")
    get.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                     help="where to quantize (default auto: the GPU when it has room, else the CPU)")
    get.add_argument("--keep-source", action="store_true", help="keep the downloaded 16-bit model folder")
    get.add_argument("--default", action="store_true", help="make it the default model")
    get.add_argument("--force", action="store_true",
                     help="quantize again even if its checkpoint exists (one made with another --method or "
                          "recipe is refused without it)")
    get.add_argument("--replace", action="store_true",
                     help="point the name at this model even if it is registered to another one")
    get.set_defaults(func=run_get)


def endpoint_url(text: str) -> str:
    """--endpoint: a URL with its scheme (a bare host name would be read as a path)."""
    url = normalize_endpoint(text)
    problem = endpoint_problem(url)
    if problem is None:
        return url
    if problem == "other scheme":
        raise argparse.ArgumentTypeError(f"{text!r} must be an http(s) URL, such as https://hf-mirror.com")
    raise argparse.ArgumentTypeError(f"{text!r} needs https:// in front (e.g. https://{url or 'hf-mirror.com'})")


def warn_about(problems: list[str]) -> None:
    for problem in problems:
        print(f"qwen-tray: warning: {problem}", file=sys.stderr)


def unreachable_advice(error: HubUnreachableError) -> str:
    """What to try when the source does not answer, in the CLI's options."""
    if error.source == "modelscope":
        if error.custom_endpoint:
            return ("check the network, the proxy and the endpoint (--endpoint or MODELSCOPE_ENDPOINT), "
                    "or use --source hf")
        return "check the network or the proxy, or use --source hf (with --endpoint https://hf-mirror.com if needed)"
    if error.custom_endpoint:
        return ("check the network, the proxy and the mirror's URL (--endpoint or HF_ENDPOINT), or leave the "
                "mirror out to use huggingface.co, or use --source modelscope")
    return ("check the network or the proxy, or use a mirror (--endpoint https://hf-mirror.com or HF_ENDPOINT) "
            "or --source modelscope")


def run_catalog(args: argparse.Namespace) -> int:
    from app.engine.cuda.fit import Machine
    from app.hub.catalog import read_catalog
    from app.hub.plan import plan_entry

    catalog = read_catalog()
    warn_about(catalog.problems)
    machine = Machine.detect()
    for entry in catalog.entries:
        try:
            plan = plan_entry(entry, machine)
        except QwenTrayError as e:  # one entry's problem: the others are still listed
            print(f"{entry.name}  (recipe {entry.recipe}; {e})")
            continue
        sizes = (f"download {format_size_gb(plan.download_bytes)}, checkpoint {format_size_gb(plan.checkpoint_bytes)}"
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
    from app.hub.catalog import find_entry, read_catalog
    from app.hub.job import GetModelJob
    from app.hub.reporting import job_reporter
    from app.settings.console import console_store

    catalog = read_catalog()
    warn_about(catalog.problems)
    job = GetModelJob(find_entry(args.name, catalog.entries), source=args.source, recipe=args.recipe, method=args.method,
                      keep_source=args.keep_source, make_default=args.default, endpoint=args.endpoint,
                      device=args.device, machine=Machine.detect(), replace=args.replace, force=args.force,
                      store=console_store())
    with job_reporter() as report:
        stage = _LastStage(report)
        try:
            got = job.run(stage)
        except KeyboardInterrupt:
            raise Interrupted(stopped_getting(job, stage.last)) from None
        except HubUnreachableError as e:
            raise e.advised(unreachable_advice(e), "the same command resumes it") from None
    default = " (default)" if got.is_default else ""
    print(f"{got.name}{default}: {got.path}")
    if got.fit is not None:
        print(f"the tray runs it {got.fit.text}")
    if got.source_kept is not None:
        print(f"source kept in {got.source_kept}")
    if got.source_left is not None:
        print(f"note: the download {got.source_left} ({format_bytes(got.source_left_bytes)}) could not be deleted "
              "completely (a file in it was in use); it can be deleted once Qwen Tray is closed")
    return 0


class _LastStage:
    """Passes a job's progress on and remembers the stage it reached."""

    def __init__(self, report):
        self.report, self.last = report, None

    def __call__(self, progress: JobProgress) -> None:
        self.last = progress.stage
        self.report(progress)


def stopped_getting(job, stage: str | None) -> str:
    """What Ctrl+C left of `models get` at ``stage``: never a registration; the download and the
    quantizer's finished layers stay for the same command to resume."""
    if stage == QUANTIZING:
        return (f"stopped while quantizing {job.name}: nothing was registered; the download and the finished "
                "layers are kept and the same command resumes from them")
    if stage == REGISTERING:
        return f"stopped while registering {job.name}: its checkpoint is complete; the same command registers it"
    kept = job.downloaded_bytes()
    if kept <= 0:
        return f"stopped before anything of {job.name} was downloaded; nothing was registered"
    return (f"stopped: the download of {job.name} is paused, what was downloaded ({format_bytes(kept)} in "
            f"{job.source_folder}) is kept and the same command resumes it; nothing was registered")
