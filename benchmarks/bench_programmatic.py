#!/usr/bin/env python3
"""Programmatic dependent launches on vs off, same run, same synthetic models (SM90+ GPUs).

For each model the runner is built twice (its decode graphs capture the launch mode in
force) and measured the same way as benchmarks/bench_decode.py: decode tokens/s at batch 1
and 8 (host loop and graph-only), our linear layers alone (graphed), the 512-token GEMM
prefill and the prefill through the decode graph. Prints both modes side by side with the
ratio and llama.cpp's decode on the same GPU kind (../shared/anchors.md); writes JSON.

    python -m benchmarks.bench_programmatic --commit SHA [--out docs/results/programmatic_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES
from app.kernels import programmatic
from benchmarks.common import (
    DEV, LLAMA_CPP, RUNS, TARGETS, copy_bandwidth_gbps, decode_tokens_per_s, fresh, linears_only_us, prefill_time,
    require_gpu, spec_of,
)

MODES = ("off", "on")


def measure(model: str, recipe: str, mode: str) -> dict:
    spec = spec_of(model)
    programmatic.set_mode(mode)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=8, max_context=4096, device=DEV, label=f"Qwen2.5-{model}")
    try:
        row = dict(mode=mode, decode={})
        for batch in (1, 8):
            tps, step_us, _pipelined = decode_tokens_per_s(runner, batch, spec.vocab_size)
            row["decode"][batch] = dict(tokens_per_s=tps, graph_step_us=step_us,
                                        graph_tokens_per_s=batch * 1e6 / step_us)
        row["bytes_per_token"] = runner.weights.bytes_per_token
        row["linears_only_us"] = linears_only_us(runner)
        row["prefill_gemm_512_s"] = prefill_time(runner, 512, spec.vocab_size)
        runner.gemm = None  # through the decode graph
        row["prefill_graph_512_s"] = prefill_time(runner, 512, spec.vocab_size, repeats=1)
        return row
    finally:
        runner.close()
        programmatic.set_mode(None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/programmatic_h200.json")
    ap.add_argument("--only", choices=[f"{m}-{r}" for m, r in RUNS], action="append")
    args = ap.parse_args()
    require_gpu()
    props = torch.cuda.get_device_properties(DEV)
    capability = torch.cuda.get_device_capability(DEV)
    reason = programmatic.unsupported_reason(capability)
    if reason is not None:
        raise SystemExit(f"programmatic launches are unavailable on {props.name}: {reason}")
    copy = copy_bandwidth_gbps()
    result = dict(gpu=props.name, sms=props.multi_processor_count, date=dt.date.today().isoformat(),
                  commit=args.commit, torch=torch.__version__, copy_gbps=copy, models=[])
    for model, recipe in RUNS:
        if args.only and f"{model}-{recipe}" not in args.only:
            continue
        entry = dict(model=f"Qwen2.5-{model}", recipe=recipe, modes={m: measure(model, recipe, m) for m in MODES})
        result["models"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)


def print_table(r: dict) -> None:
    print(f"\n{r['gpu']} ({r['sms']} SMs), copy {r['copy_gbps']:.0f} GB/s, commit {r['commit']}")
    print(f"{'model':<18}{'launch':>7}{'B=1 tok/s':>10}{'graph':>8}{'B=8':>8}{'%copy':>7}{'lin-only':>9}"
          f"{'pf512 ms':>9}{'graph-pf512':>12}")
    for m in r["models"]:
        for mode, row in m["modes"].items():
            d = row["decode"]
            frac = row["bytes_per_token"] / d[1]["graph_step_us"] / 1e3 / r["copy_gbps"]
            print(f"{m['model'] + ' ' + m['recipe']:<18}{mode:>7}{d[1]['tokens_per_s']:>10.0f}"
                  f"{d[1]['graph_tokens_per_s']:>8.0f}{d[8]['tokens_per_s']:>8.0f}{100 * frac:>6.0f}%"
                  f"{1e6 / row['linears_only_us']:>9.0f}{row['prefill_gemm_512_s'] * 1e3:>9.1f}"
                  f"{row['prefill_graph_512_s'] * 1e3:>11.1f}")
    print("\nratios, programmatic / plain (batch 1 host loop, graph-only, batch 8, linears only):")
    for m in r["models"]:
        on, off = m["modes"]["on"], m["modes"]["off"]
        ratios = [on["decode"][1]["tokens_per_s"] / off["decode"][1]["tokens_per_s"],
                  off["decode"][1]["graph_step_us"] / on["decode"][1]["graph_step_us"],
                  on["decode"][8]["tokens_per_s"] / off["decode"][8]["tokens_per_s"],
                  off["linears_only_us"] / on["linears_only_us"]]
        size = m["model"].split("-")[1]
        tps = on["decode"][1]["tokens_per_s"]
        target = TARGETS.get((size, m["recipe"]))
        extra = f", vs target {target} {tps / target:.2f}x" if target else ""
        print(f"  {m['model']} {m['recipe']}: " + " / ".join(f"{x:.3f}x" for x in ratios)
              + f"; programmatic vs llama.cpp {tps / LLAMA_CPP[size]['decode']:.2f}x{extra}")


if __name__ == "__main__":
    main()
