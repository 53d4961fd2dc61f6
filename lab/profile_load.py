"""Where a cached GPU load spends its time: cProfile of ``Engine.load`` in a fresh process.

    python -m lab.profile_load [--model 3B:w4] [--cache /tmp/bench] [--out profile.txt]

The synthetic checkpoint comes from benchmarks.bench_startup's cache; a first load in a child
process fills CuPy's kernel cache, the profiled load runs in a second child (a user's every
later start). Prints the app's functions by cumulative time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import cProfile, io, pstats, sys, time
import torch
torch.cuda.init(); torch.empty(1, device="cuda")
from app.engine import Engine
t = time.perf_counter()
profile = cProfile.Profile()
profile.enable()
engine = Engine.load(sys.argv[1], device="cuda", max_batch_size=1, fit_to_vram=True)
torch.cuda.synchronize()
profile.disable()
print(f"Engine.load: {time.perf_counter() - t:.3f} s")
out = io.StringIO()
stats = pstats.Stats(profile, stream=out).sort_stats("cumulative")
stats.print_stats(r"app/|cupy|torch/cuda/graphs", 45)
print(out.getvalue())
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="3B:w4")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/bench"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from benchmarks.bench_startup import prepare

    path = prepare(args.model, args.cache)
    for label in ("fill the kernel cache", "profiled"):
        done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True)
        print(f"== {label}", flush=True)
    print(done.stdout)
    if args.out:
        args.out.write_text(done.stdout)


if __name__ == "__main__":
    main()
