#!/usr/bin/env python3
"""Where a replayed decode step's time goes, kernel by kernel (CUPTI through torch.profiler).

The decode graph is replayed under the profiler after 512-token prompts (batch 1); every kernel
of the last replay is listed with its start and end. Kernels of one step run one after the
other (each waits for the one before; with programmatic launches the next one starts early and
waits inside), so a kernel's *exposed* time is how much later it ends than the kernel before
it: the exposed times add up to the step, and they are what removing or speeding up that
kernel could save. Grouped by role (the layer's kernels come in a fixed order:
app/engine/cuda/graphs.py DecodeStep.run).

    python -m lab.probe_step_timeline --commit SHA [--out docs/results/step_timeline_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import DEV, PROMPT, fresh, prompt_ids, spec_of

from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES

RUNS = [("3B", "w4"), ("7B", "mixed")]
REPLAYS = 3


def kernels_of_last_replay(graph) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every GPU kernel of the last of REPLAYS replays."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start),
                     key=lambda k: k[1])
    per_replay = len(kernels) // REPLAYS
    return kernels[-per_replay:]


def role(name: str, gemv_index: int, layers: int) -> str:
    """The kernel's part of the step; GEMVs by their order (4 a layer, then the head)."""
    low = name.lower()
    if "gemv_kernel" in name:
        return "lm_head" if gemv_index >= 4 * layers else ("qkv", "o", "gate_up", "down")[gemv_index % 4]
    for key, part in (("attn_split", "attention split"), ("attn_combine", "attention combine"),
                      ("rms_norm", "norm"), ("rope", "rope"), ("argmax", "argmax")):
        if key in low:
            return part
    return "other: " + name[:60]


def timeline(model: str, recipe: str) -> dict:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=1, max_context=1024, device=DEV, prefill_mode="gemm",
                                label=f"Qwen2.5-{model}")
    try:
        runner.prefill(0, prompt_ids(PROMPT, 0, spec.vocab_size), 0)
        runner.decode_tokens([0], [1], [PROMPT])
        kernels = kernels_of_last_replay(runner.graphs.graphs[runner.graphs.bucket_for(1)])
    finally:
        runner.close()
    exposed: dict[str, float] = defaultdict(float)
    duration: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    gemvs, prev_end, layers_started = 0, kernels[0][1], False
    for name, start, end in kernels:
        # everything before the first norm or GEMV is the embedding lookup (PyTorch ops)
        layers_started = layers_started or "gemv_kernel" in name or "rms_norm" in name
        part = role(name, gemvs, spec.num_layers) if layers_started else "embedding"
        gemvs += "gemv_kernel" in name
        exposed[part] += max(0.0, end - prev_end)
        duration[part] += end - start
        count[part] += 1
        prev_end = max(prev_end, end)
    step = kernels[-1][2] - kernels[0][1]
    parts = sorted(exposed, key=exposed.get, reverse=True)
    return dict(model=f"Qwen2.5-{model}", recipe=recipe, layers=spec.num_layers, kernels=len(kernels),
                step_us=step, parts={p: dict(count=count[p], exposed_us=exposed[p], duration_us=duration[p],
                                             exposed_per_kernel_us=exposed[p] / count[p]) for p in parts},
                first_layer=[dict(name=n[:80], start_us=s - kernels[0][1], end_us=e - kernels[0][1])
                             for n, s, e in kernels[:1 + 6 * 2]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/step_timeline_h200.json")
    args = ap.parse_args()
    result = dict(gpu=torch.cuda.get_device_name(DEV), date=dt.date.today().isoformat(), commit=args.commit,
                  batch=1, context=PROMPT, models=[])
    for model, recipe in RUNS:
        row = timeline(model, recipe)
        result["models"].append(row)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"{row['model']} {recipe}: {row['kernels']} kernels, step {row['step_us']:.0f} µs (profiled)")
        for part, v in row["parts"].items():
            print(f"  {part:22s} x{v['count']:4d}  exposed {v['exposed_us']:7.1f} µs "
                  f"({v['exposed_per_kernel_us']:.2f} each)  duration {v['duration_us']:7.1f} µs")


if __name__ == "__main__":
    main()
