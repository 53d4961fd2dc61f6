#!/usr/bin/env python3
"""Long prompts through the GEMM prefill: the later chunks' attention, one flash call or a loop.

A prompt longer than the plan's chunk (512 tokens here) runs its first chunk from a CUDA graph
and the rest eagerly; each later chunk attends to every earlier key. The product takes that
in one flash-attention call (causal from the bottom-right corner, all query groups at once,
``app.engine.cuda.prefill.flash_takes_gqa``); the alternative is one masked SDPA call per
query group. Both are timed in the same run for 512-4,096-token prompts (synthetic Qwen2.5
shapes, time to the first token's logits on the CPU), with llama.cpp's 512-token prefill on
the same GPU kind (shared/anchors.md) beside them.

    python -m benchmarks.bench_long_prefill --commit SHA [--out docs/results/long_prefill_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from app.engine.cuda import prefill as prefill_mod
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES
from benchmarks.common import DEV, LLAMA_CPP, fresh, prefill_time, require_gpu, spec_of

RUNS = [("3B", "w4"), ("7B", "mixed")]
LENGTHS = (512, 1024, 2048, 4096)


def run_model(model: str, recipe: str) -> dict:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=1, max_context=max(LENGTHS), device=DEV, prefill_mode="gemm",
                                label=f"Qwen2.5-{model}")
    flash = prefill_mod.flash_takes_gqa
    rows = []
    try:
        for n in LENGTHS:
            one_call = prefill_time(runner, n, spec.vocab_size)
            prefill_mod.flash_takes_gqa = lambda *a: False
            try:
                loop = prefill_time(runner, n, spec.vocab_size)
            finally:
                prefill_mod.flash_takes_gqa = flash
            rows.append(dict(tokens=n, one_call_s=one_call, group_loop_s=loop, one_call_tokens_per_s=n / one_call,
                             group_loop_tokens_per_s=n / loop, speedup=loop / one_call))
    finally:
        runner.close()
    return dict(model=f"Qwen2.5-{model}", recipe=recipe, chunk=runner.gemm.chunk if runner.gemm else None,
                llama_cpp_prefill_512=LLAMA_CPP[model]["prefill_512"], rows=rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/long_prefill_h200.json")
    args = ap.parse_args()
    require_gpu()
    result = dict(gpu=torch.cuda.get_device_name(DEV), date=dt.date.today().isoformat(), commit=args.commit,
                  torch=torch.__version__, models=[run_model(m, r) for m, r in RUNS])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['gpu']}: prompt -> first token, later chunks in one flash call vs a masked call per group")
    for m in result["models"]:
        print(f"{m['model']} {m['recipe']} (chunk {m['chunk']}; llama.cpp 512-token prefill "
              f"{m['llama_cpp_prefill_512']:,} tokens/s):")
        for r in m["rows"]:
            print(f"  {r['tokens']:>5} tokens: one call {r['one_call_s'] * 1e3:7.1f} ms ({r['one_call_tokens_per_s']:>7,.0f}"
                  f" tok/s), group loop {r['group_loop_s'] * 1e3:7.1f} ms ({r['group_loop_tokens_per_s']:>7,.0f}), "
                  f"{r['speedup']:.2f}x, vs llama.cpp {r['one_call_tokens_per_s'] / m['llama_cpp_prefill_512']:.2f}x")


if __name__ == "__main__":
    main()
