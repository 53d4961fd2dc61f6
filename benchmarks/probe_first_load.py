#!/usr/bin/env python3
"""What a user's first GPU load costs: the kernel instances it compiles, and in what time.

Each case runs in a spawned process whose CuPy kernel cache (``CUPY_CACHE_DIR``) is a new, empty
folder, as on a user's first run: the tray's load of a model (4 requests of 4,096 tokens, fitted
to 3.2 GiB) is built and timed, with every NVRTC compile recorded (``loader._compiled``). Then:
- the same build again in a new process over the now-filled cache (every later load);
- the recorded instances compiled by ``--workers`` processes into another empty cache, then the
  build over it: what compiling in parallel before the build would give;
- the instances compiled by that many threads in one process (whether NVRTC runs beside the GIL).

    python -m benchmarks.probe_first_load --commit SHA [--models 3B:w4,7B:mixed] [--workers 4,8]
        [--out docs/results/first_load_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path



def _in_process(cache_dir: str, fn, *args):
    """fn(*args) in a spawned process whose CuPy cache is ``cache_dir``."""
    os.environ["CUPY_CACHE_DIR"] = cache_dir  # inherited by the spawned child
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def build(model: str, recipe: str) -> dict:
    """Build the tray's load of ``model`` (synthetic weights), recording every compile."""
    import torch

    from app.engine.cuda.runner import runner_for_weights
    from app.engine.cuda.synthetic import synthetic_weights
    from app.formats.recipe import BUILTIN_RECIPES
    from app.kernels import loader
    from benchmarks.common import prompt_ids, spec_of

    compiled, original = [], loader._compiled

    def recording(filename, name_expression, device_index):
        misses, started = original.cache_info().misses, time.perf_counter()
        kernel = original(filename, name_expression, device_index)
        if original.cache_info().misses > misses:  # compiled here (or read from the disk cache), not a repeat
            compiled.append((filename, name_expression, time.perf_counter() - started))
        return kernel

    loader._compiled = recording
    weights = synthetic_weights(spec_of(model), BUILTIN_RECIPES[recipe], "cpu", seed=1)
    torch.cuda.init()
    started = time.perf_counter()
    runner = runner_for_weights(weights, num_slots=4, max_context=4096, device=torch.device("cuda"),
                                vram_budget=int(3.2 * 2**30), fit=True)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    shape = (runner.num_slots, runner.max_context)
    built = len(compiled)
    started = time.perf_counter()
    runner.prefill(0, prompt_ids(600, 0, runner.weights.spec.vocab_size), 0)  # a graph chunk, then an eager one
    torch.cuda.synchronize()
    first_prompt_s = time.perf_counter() - started
    runner.close()
    return dict(build_s=seconds, first_prompt_s=first_prompt_s, slots_context=shape, built_instances=built,
                instances=[list(c) for c in compiled], compile_s=sum(c[2] for c in compiled))


def compile_some(names: list[tuple[str, str]]) -> float:
    from app.kernels import loader

    started = time.perf_counter()
    for filename, expr in names:
        loader._compiled(filename, expr, 0)
    return time.perf_counter() - started


def compile_threaded(names: list[tuple[str, str]], workers: int) -> float:
    from app.kernels import loader

    compile_one = loader._compiled.__wrapped__  # past the lru_cache: each call compiles (or reads the disk cache)
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: compile_one(n[0], n[1], 0), names))
    return time.perf_counter() - started


def parallel_precompile(names: list[tuple[str, str]], workers: int, cache_dir: str) -> float:
    """Compile ``names`` in ``workers`` spawned processes sharing the cache; wall seconds incl. spawning."""
    os.environ["CUPY_CACHE_DIR"] = cache_dir
    shards = [names[i::workers] for i in range(workers)]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(compile_some, shards)
    return time.perf_counter() - started


def case(model: str, recipe: str, workers: list[int]) -> dict:
    out = dict(model=f"Qwen2.5-{model}", recipe=recipe)
    with tempfile.TemporaryDirectory() as cold:
        first = _in_process(cold, build, model, recipe)
        out["first"] = first
        out["cached_build_s"] = _in_process(cold, build, model, recipe)["build_s"]
    names = [(f, e) for f, e, _ in first["instances"]]
    print(f"{model} {recipe}: {len(names)} instances ({first['built_instances']} in the build), first build "
          f"{first['build_s']:.1f} s + first prompt {first['first_prompt_s']:.1f} s ({first['compile_s']:.1f} s "
          f"compiling), cached build {out['cached_build_s']:.1f} s", flush=True)
    out["parallel"] = {}
    for n in workers:
        with tempfile.TemporaryDirectory() as cold:
            pre = parallel_precompile(names, n, cold)
            after = _in_process(cold, build, model, recipe)["build_s"]
        with tempfile.TemporaryDirectory() as cold:
            threaded = _in_process(cold, compile_threaded, names, n)
        out["parallel"][n] = dict(processes_s=pre, build_after_s=after, threads_s=threaded)
        print(f"  {n} workers: processes {pre:.1f} s + build {after:.1f} s; threads {threaded:.1f} s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--models", default="3B:w4,7B:mixed")
    parser.add_argument("--workers", default="4,8")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch

    from benchmarks.common import require_gpu

    require_gpu()

    result = dict(gpu=torch.cuda.get_device_name(), cpus=os.cpu_count(), date=dt.date.today().isoformat(),
                  commit=args.commit, torch=torch.__version__, cases=[])
    workers = [int(w) for w in args.workers.split(",")]
    for item in args.models.split(","):
        model, recipe = item.split(":")
        result["cases"].append(case(model, recipe, workers))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
