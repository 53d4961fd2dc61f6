#!/usr/bin/env python3
"""Where an eager prefill chunk's host time goes (cProfile of the Python side).

A later prompt chunk runs eagerly (its attention length changes every chunk), and on a big
GPU it is host-bound: bench_long_prefill.py measured ~22 ms for a 512-token chunk of the 3B
whose GPU work takes ~9 ms (the graphed first chunk). This runs a 1,024-token prompt on the
synthetic Qwen2.5-3B `w4` (first chunk graphed, second eager) under cProfile and prints the
functions with the most own time, and the wall time with and without the profiler.

    python -m lab.probe_prefill_host [--tokens 1024] [--out docs/results/probe_prefill_host_h200.txt]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

import torch

from benchmarks.common import DEV, fresh, prompt_ids, spec_of

from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--model", default="3B")
    ap.add_argument("--out", default="docs/results/probe_prefill_host_h200.txt")
    args = ap.parse_args()
    spec = spec_of(args.model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES["w4" if args.model == "3B" else "mixed"], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=1, max_context=4096, device=DEV, prefill_mode="gemm")
    ids = prompt_ids(args.tokens, 99, spec.vocab_size)
    for _ in range(3):
        runner.prefill(0, ids, 0)
    torch.cuda.synchronize()
    started = time.perf_counter()
    runner.prefill(0, ids, 0)
    plain = time.perf_counter() - started
    profiler = cProfile.Profile()
    profiler.enable()
    runner.prefill(0, ids, 0)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).sort_stats("tottime")
    stats.print_stats(30)
    head = (f"{torch.cuda.get_device_name(DEV)}: Qwen2.5-{args.model}, {args.tokens}-token prompt "
            f"(first {runner.gemm.chunk} tokens graphed), {plain * 1e3:.1f} ms without the profiler\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(head + text.getvalue())
    print(head + text.getvalue()[:6000])
    runner.close()


if __name__ == "__main__":
    main()
