#!/usr/bin/env python3
"""Experiment: how much of a decode step is launch/latency cost, and would L2 prefetch pay?

1. Cold (weights rotated over > 512 MB, from DRAM) vs hot (one copy, L2-resident after the
   first launch) graph time of every GEMV shape at M = 1: what the kernels could reach if
   their weights were already in L2.
2. A layer's MLP (gate_up + down) after a latency-bound "filler" (qkv + o GEMVs on other
   weights), with and without a prefetch kernel (``prefetch.global.L2``, plain PTX, SM80+)
   launched before the filler: does the DRAM, idle during the filler, fill L2 in time?
3. torch.profiler over graph replays of a real 3B ``w4`` decode step: device time per kernel
   kind per step, and the step's wall time (the difference is launch gaps).

    python -m lab.probe_l2 [--out docs/results/probe_l2_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.common import (
    DEV,
    KERNEL_SHAPES,
    gemv_cases,
    gemv_fn,
    n_copies,
    rand_weights,
    time_us,
    weight_bytes,
)

PREFETCH_SOURCE = r"""
extern "C" __global__ void prefetch_l2(const char* a, long na, const char* b, long nb, int evict_last) {
    const long stride = (long)gridDim.x * blockDim.x * 128;
    const long first = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 128;
    for (int part = 0; part < 2; ++part) {
        const char* p = part ? b : a;
        const long n = part ? nb : na;
        for (long i = first; i < n; i += stride) {
            if (evict_last) asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(p + i));
            else asm volatile("prefetch.global.L2 [%0];" :: "l"(p + i));
        }
    }
}
"""


def prefetch_kernel():
    import cupy

    return cupy.RawKernel(PREFETCH_SOURCE, "prefetch_l2")


def launch_prefetch(kernel, tensors: list[torch.Tensor], evict_last: bool, blocks: int) -> None:
    """Prefetch the bytes of (at most two) contiguous tensors into L2 on torch's stream."""
    import cupy
    import numpy as np

    ptrs = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors] + [(0, 0)] * (2 - len(tensors))
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    with stream:
        kernel((blocks,), (256,), (ptrs[0][0], np.int64(ptrs[0][1]), ptrs[1][0], np.int64(ptrs[1][1]),
                                   np.int32(int(evict_last))))


def hot_vs_cold() -> list[dict]:
    rows = []
    for model in KERNEL_SHAPES:
        for name, bits, n, k, gated in gemv_cases(model):
            nbytes = weight_bytes(bits, n, k)
            ws = rand_weights(bits, n, k, n_copies(nbytes))
            x = torch.randn(1, k, device=DEV).half()
            cold = time_us(gemv_fn(bits, gated, ws, x), graph=True)
            hot = time_us(gemv_fn(bits, gated, ws[:1], x), graph=True)
            rows.append(dict(shape=name, mb=nbytes / 1e6, cold_us=cold, hot_us=hot, cold_gbps=nbytes / cold / 1e3,
                             hot_gbps=nbytes / hot / 1e3))
            print(f"{name:16s} {nbytes / 1e6:7.1f} MB  cold {cold:7.2f} us  hot {hot:7.2f} us", flush=True)
            del ws
            torch.cuda.empty_cache()
    return rows


def mlp_prefetch(model: str, kernel, sms: int) -> list[dict]:
    """Filler (qkv + o GEMVs) then gate_up + down, with/without a prefetch of the MLP first."""
    cases = {c[0].split(".")[1]: c for c in gemv_cases(model)}
    sets = 6
    mlp = {part: rand_weights(cases[part][1], cases[part][2], cases[part][3], sets) for part in ("gate_up", "down")}
    fill = {part: rand_weights(cases[part][1], cases[part][2], cases[part][3], sets) for part in ("qkv", "o")}
    c = KERNEL_SHAPES[model]
    x, xi = torch.randn(1, c["hidden"], device=DEV).half(), torch.randn(1, c["inter"], device=DEV).half()
    fns = {p: gemv_fn(cases[p][1], cases[p][4], ws, x if p != "down" else xi) for p, ws in {**mlp, **fill}.items()}

    def step(prefetch: str, limit_mb: float):
        def run(i):
            if prefetch != "none":
                i2 = i % sets
                tensors = [mlp["gate_up"][i2][0], mlp["down"][i2][0]]  # the packed words (scales: 1.5 %)
                if limit_mb:
                    tensors = [mlp["down"][i2][0], mlp["gate_up"][i2][0][: int(limit_mb * 1e6) // (4 * mlp["gate_up"][i2][0].shape[1])]]
                launch_prefetch(kernel, tensors, prefetch == "evict_last", 4 * sms)
            fns["qkv"](i)
            fns["o"](i)
            fns["qkv"](i + 1)
            fns["o"](i + 1)
            fns["gate_up"](i)
            fns["down"](i)
        return run

    rows = []
    variants = [("none", 0), ("normal", 0), ("evict_last", 0)]
    if model.startswith("7b"):
        variants += [("normal", 16), ("normal", 24)]
    for prefetch, limit in variants:
        us = time_us(step(prefetch, limit), graph=True, launches=sets, trials=20)
        rows.append(dict(model=model, prefetch=prefetch, gate_up_limit_mb=limit, us=us))
        print(f"{model} MLP after filler, prefetch={prefetch} limit={limit}: {us:.2f} us", flush=True)
    filler = time_us(lambda i: (fns["qkv"](i), fns["o"](i), fns["qkv"](i + 1), fns["o"](i + 1)), graph=True,
                     launches=sets, trials=20)
    rows.append(dict(model=model, prefetch="filler_only", us=filler))
    print(f"{model} filler alone: {filler:.2f} us", flush=True)
    return rows


def profile_step(model: str, recipe: str) -> dict:
    from benchmarks.common import spec_of

    from app.engine.cuda.runner import runner_for_weights
    from app.engine.cuda.synthetic import synthetic_weights
    from app.formats.recipe import BUILTIN_RECIPES

    spec = spec_of(model)
    runner = runner_for_weights(synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1), num_slots=8,
                                max_context=4096, device=torch.device(DEV), label=model)
    runner.prefill(0, list(range(1, 513)), 0)
    runner.decode_tokens([0], [1], [512])
    graph = runner.graphs.graphs[1]
    step_us = time_us(lambda _i: graph.replay(), graph=False, launches=10, trials=10)
    replays = 10
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    per_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            key = ev.name.split("(")[0][:60]
            per_kind[key][0] += ev.device_time_total / replays if hasattr(ev, "device_time_total") else ev.cuda_time_total / replays
            per_kind[key][1] += 1 / replays
    kinds = {k: dict(us_per_step=v[0], launches_per_step=v[1]) for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1][0])}
    busy = sum(v["us_per_step"] for v in kinds.values())
    runner.close()
    print(f"{model} {recipe}: step {step_us:.1f} us, kernels busy {busy:.1f} us, "
          f"{sum(v['launches_per_step'] for v in kinds.values()):.0f} launches", flush=True)
    for k, v in kinds.items():
        print(f"   {v['us_per_step']:8.1f} us  x{v['launches_per_step']:5.0f}  {k}", flush=True)
    return dict(model=model, recipe=recipe, step_us=step_us, busy_us=busy, kinds=kinds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/results/probe_l2_h200.json")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--parts", default="profile,hot_vs_cold,mlp_prefetch",
                    help="comma-separated subset of profile,hot_vs_cold,mlp_prefetch")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    result = dict(gpu=props.name, sms=sms, l2_bytes=getattr(props, "L2_cache_size", None),
                  date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), commit=commit)
    if "profile" in parts:
        result["profile"] = [profile_step("3B", "w4"), profile_step("7B", "mixed")]
    if "hot_vs_cold" in parts:
        result["hot_vs_cold"] = hot_vs_cold()
    if "mlp_prefetch" in parts:
        kernel = prefetch_kernel()
        result["mlp_prefetch"] = mlp_prefetch("3b_w4", kernel, sms) + mlp_prefetch("7b_mixed", kernel, sms)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
