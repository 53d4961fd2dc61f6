#!/usr/bin/env python3
"""Where a decode step's time goes: the step with one kind of op replaced by nothing.

Not a correctness run (the logits are garbage when an op is skipped): each variant builds the
runner with those KernelOps methods turned into no-ops, so its CUDA graph simply lacks those
kernels, and times the replayed graph at batch 1 (or ``--batch``) after 512-token prompts
(benchmarks.common.decode_tokens_per_s). The difference to the full step is what those kernels
cost in place, their launch and dependency gaps included: the ceiling of what fusing them
away could give. The other variants are the full step built with other RunnerOptions
(app.engine.runner): ``unstaged_x`` never stages x in shared memory in the GEMVs
(``gemv=GemvOptions(stage_x_bytes=0)``); ``unfused_norm`` runs the batch-1 RMSNorms with the
norm kernel instead of fused into the GEMVs (``fuse_norms=False``); ``fused_norm_everywhere``
fuses every norm the kernels can take, however much the prologues read
(``norm_prologue_bytes``); ``norm_prologue_20mib`` raises that limit to 20 MiB, which fuses the
7B's gate/up norm and no head's. ``no_preload`` never copies GEMV weights into shared memory
before the wait (``GemvOptions(preload_weights=False)``). ``torch_embedding`` looks the embedding
up with PyTorch ops instead of the dequantization kernel (runner_for_weights(dequant=False));
``torch_argmax`` takes the greedy tokens with ``torch.argmax`` instead of argmax.cu.
``unfused_rope`` runs RoPE + KV write as its own kernel before the attention
(``fuse_rope=False``); ``no_rope`` and ``no_attention`` skip one of the two
unfused kernels. ``no_norm`` removes only the norms that run as kernels (at batch 1 since phase 10: layer 0's,
the heads', and the 7B's before the gate/up); ``no_norm_at_all`` removes every norm (the
norm kernels with the fusion off).

    python -m lab.ablate_step --commit SHA [--out docs/results/ablate_step_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from app.engine.cuda.ops import KernelOps
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.engine.runner import RunnerOptions
from app.formats.recipe import BUILTIN_RECIPES
from app.kernels import programmatic
from app.kernels.gemv import GemvOptions
from benchmarks.common import DEV, decode_tokens_per_s, fresh, spec_of

SKIPPABLE = ("rms_norm", "rope_kv_write", "attention", "rope_attention")
VARIANTS = {"full": (), "no_norm": ("rms_norm",), "no_rope": ("rope_kv_write", "rope_fusion"),
            "no_attention": ("attention", "rope_fusion"), "linears_only": SKIPPABLE + ("rope_fusion",),
            "unstaged_x": ("x_staging",), "unfused_norm": ("norm_fusion",),
            "fused_norm_everywhere": ("norm_prologue_limit",), "no_norm_at_all": ("rms_norm", "norm_fusion"),
            "unfused_rope": ("rope_fusion",), "no_preload": ("weight_preload",),
            "torch_embedding": ("embedding_kernel",), "torch_argmax": ("argmax_kernel",),
            "norm_prologue_20mib": ("norm_prologue_20mib",)}
SETTINGS = ("x_staging", "norm_fusion", "norm_prologue_limit", "norm_prologue_20mib", "rope_fusion",
            "weight_preload", "embedding_kernel", "argmax_kernel")  # not ops: switches of the full step
RUNS = [("3B", "w4"), ("7B", "mixed")]


def options_for(skipped: tuple[str, ...]) -> RunnerOptions:
    """The full step's RunnerOptions with the settings among ``skipped`` switched off."""
    norm_limit = RunnerOptions().norm_prologue_bytes
    if "norm_prologue_limit" in skipped:
        norm_limit = 1 << 62
    if "norm_prologue_20mib" in skipped:  # the 7B gate/up's 17 MB of prologues, not the heads'
        norm_limit = 20 << 20
    return RunnerOptions(fuse_norms="norm_fusion" not in skipped, norm_prologue_bytes=norm_limit,
                         fuse_rope="rope_fusion" not in skipped,
                         gemv=GemvOptions(stage_x_bytes=0 if "x_staging" in skipped else GemvOptions().stage_x_bytes,
                                          preload_weights="weight_preload" not in skipped))


def ops_without(skipped: tuple[str, ...], options: RunnerOptions) -> KernelOps:
    ops = KernelOps(options)
    for name in (n for n in skipped if n not in SETTINGS):
        setattr(ops, name, lambda *args, out=None, q_out=None, **kw: out if out is not None else q_out)
    if "argmax_kernel" in skipped:  # PyTorch's reduction instead of argmax.cu
        ops.argmax = lambda logits, *, out, workspace: torch.argmax(logits, dim=-1, out=out)
    return ops


def step_us(model: str, recipe: str, skipped: tuple[str, ...], batch: int = 1) -> float:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    options = options_for(skipped)
    runner = runner_for_weights(weights, num_slots=batch, max_context=1024, device=DEV, prefill_mode="gemm",
                                label=f"Qwen2.5-{model}", dequant="embedding_kernel" not in skipped,
                                options=options, ops=ops_without(skipped, options))
    try:
        return decode_tokens_per_s(runner, batch, spec.vocab_size)[1]
    finally:
        runner.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/ablate_step_h200.json")
    ap.add_argument("--batch", type=int, default=1, help="sequences per step (default 1)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=1, help="times each variant is measured, interleaved "
                    "(step_us: the median, the higher of two; rounds: every value)")
    ap.add_argument("--models", default=",".join(m for m, _ in RUNS), help="comma-separated subset of 3B,7B")
    args = ap.parse_args()
    variants = {name: VARIANTS[name] for name in args.variants.split(",")}
    capability = torch.cuda.get_device_capability(DEV)
    result = dict(gpu=torch.cuda.get_device_name(DEV), date=dt.date.today().isoformat(), commit=args.commit,
                  programmatic_launch=programmatic.enabled(capability), batch=args.batch, context=512, models=[])
    for model, recipe in (r for r in RUNS if r[0] in args.models.split(",")):
        rounds: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):  # interleaved: a drift between variants shows as a spread
            for name, skipped in variants.items():
                rounds[name].append(step_us(model, recipe, skipped, args.batch))
        row = dict(model=f"Qwen2.5-{model}", recipe=recipe, layers=spec_of(model).num_layers,
                   step_us={name: sorted(v)[len(v) // 2] for name, v in rounds.items()}, rounds=rounds)
        result["models"].append(row)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for row in result["models"]:
        full = row["step_us"].get("full", float("nan"))
        parts = ", ".join(f"{k} {v:.0f} µs ({full - v:+.0f}, {(full - v) / row['layers']:.2f} per layer)"
                          for k, v in row["step_us"].items() if k != "full")
        print(f"{row['model']} {row['recipe']}: full {full:.0f} µs; {parts}")


if __name__ == "__main__":
    main()
