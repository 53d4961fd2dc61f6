#!/usr/bin/env python3
"""How much of a decode step is DRAM: the step with every layer's weights distinct (the product)
against the same step where all layers share one layer's weights, which then stay in L2.

The 3B `w4` layer's weights (38 MB) fit in an H200's 60 MiB L2, so from layer 1 on every GEMV
reads L2, not DRAM (the head, 153 MB, still streams from DRAM and flushes L2 once a step). The
difference bounds what any DRAM-side change of the GEMVs (more bytes in flight, prefetches,
layouts) can give; what remains of the shared-weights step is the kernels' latency chain.
Not a correctness run (a model whose layers are all the same one; the same kernels, shapes and
launches as the product's step). Graph-only step after 512-token prompts, batch 1, as
lab/ablate_step.py times it; rounds interleaved.

    python -m lab.probe_l2_step --commit SHA [--out docs/results/probe_l2_step_h200.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
from pathlib import Path

import torch

from benchmarks.common import DEV, decode_tokens_per_s, fresh, spec_of

from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES

RUNS = [("3B", "w4"), ("7B", "mixed")]


def step_us(model: str, recipe: str, shared: bool) -> float:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    if shared:  # one layer's tensors for every layer (the arena holds them once)
        weights = dataclasses.replace(weights, layers=[weights.layers[0]] * len(weights.layers))
    fresh()
    runner = runner_for_weights(weights, num_slots=1, max_context=1024, device=DEV, prefill_mode="gemm",
                                label=f"Qwen2.5-{model}")
    try:
        return decode_tokens_per_s(runner, 1, spec.vocab_size)[1]
    finally:
        runner.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/probe_l2_step_h200.json")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(DEV)
    result = dict(gpu=props.name, l2_bytes=props.L2_cache_size, date=dt.date.today().isoformat(),
                  commit=args.commit, batch=1, context=512, models=[])
    for model, recipe in RUNS:
        rounds: dict[str, list[float]] = {"distinct": [], "shared": []}
        for _ in range(args.rounds):
            for name in rounds:
                rounds[name].append(step_us(model, recipe, name == "shared"))
        median = {name: sorted(v)[len(v) // 2] for name, v in rounds.items()}
        result["models"].append(dict(model=f"Qwen2.5-{model}", recipe=recipe, step_us=median, rounds=rounds))
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"Qwen2.5-{model} {recipe}: distinct layers {median['distinct']:.0f} µs, one shared layer "
              f"{median['shared']:.0f} µs ({median['shared'] - median['distinct']:+.0f})")


if __name__ == "__main__":
    main()
