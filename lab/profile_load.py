"""Where `Engine.load` spends its time: cProfile of one load in a new process (torch imported first).

    python -m lab.profile_load CHECKPOINT_FOLDER [--device cuda] [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--device", default="cuda")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    if args.device == "cuda":
        torch.empty(1, device="cuda")
    from app.engine import Engine

    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    engine = Engine.load(args.path, device=args.device, max_batch_size=1, fit_to_vram=True)
    profile.disable()
    print(f"Engine.load: {time.perf_counter() - started:.3f} s")
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    engine.close()


if __name__ == "__main__":
    main()
