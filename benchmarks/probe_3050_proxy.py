#!/usr/bin/env python3
"""The RTX 3050 Laptop's decode step as near as an H200 gets: its code, its grids, 16 SMs.

The product targets a 16-SM SM86 card that the team does not have. This probe runs the decode
step the way that card would: kernels built as SM86 PTX with programmatic launches off
(app.kernels.emulate.build_as_ptx), every grid and attention split planned for 16 SMs
(emulate.plan_for_sm_count), and the step replayed while all other SMs are held by one block
each that takes the SM's whole shared memory (so no other block fits beside it; a probe
kernel's blocks, launched meanwhile, must land only on the free SMs, which is checked); then
again with the free SMs' shared memory cut to a GA10x SM's 100 KB (benchmarks/held_sms.py).

What it shows: the rate at which 16 SMs running our kernels consume the step's weight bytes,
next to the rate of a plain copy and of PyTorch's int4 kernel (linears only) on the same 16 SMs.
The 3050 has 192 GB/s of DRAM; where 16 SMs at the 3050's clock consume bytes faster than
that, the card's DRAM, not the kernels, bounds its speed. What it cannot show: the 3050's DRAM
efficiency and latency, its 2 MB L2 (the H200's 60 MB L2 stays shared by all SMs), its 48-warp
limit per SM, and GA10x tensor cores' half rate with fp32 accumulation. ``--sweep`` also times
GEMVs (``--sweep-roles``: the MLP and head ones unless told) in thirteen configs each on the
trimmed SMs (docs/history/kernels/phase-19.md).

    python -m benchmarks.probe_3050_proxy --commit SHA [--sweep [--sweep-roles qkv,o]] [--out docs/results/proxy_3050_h200.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")  # nothing may load lazily while SMs are held

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES
from app.kernels import emulate
from app.kernels.gemv import GemvConfig, default_gemv_config
from benchmarks.common import (
    DEV, PROMPT, capture, fresh, gemv_cases, gemv_fn, int4_peer_step, n_copies, peer_inputs, prompt_ids, rand_weights,
    require_cupy, require_gpu, spec_of, vars_of, weight_bytes,
)
from benchmarks.held_sms import HeldSMs, HoldHung, replay_us

cupy = require_cupy()

SMS_3050 = 16
DRAM_3050_GBPS = 192.0
CLOCK_3050_GHZ = 1.5  # a laptop 3050's sustained clock (boost 1.5-1.74 GHz by the maker's power limit)
RUNS = [("3B", "w4"), ("7B", "mixed")]


def graphed(fn) -> torch.cuda.CUDAGraph:
    """``fn(0)`` captured in a CUDA graph, replayed once before any SM is held, device idle."""
    graph = capture(fn)
    graph.replay()
    torch.cuda.synchronize()
    return graph


def decode_graph(model: str, recipe: str):
    """The batch-1 decode step's graph after a PROMPT-token prompt, and its weight bytes."""
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    runner = runner_for_weights(weights, num_slots=1, max_context=4096, device=DEV, label=f"Qwen2.5-{model}")
    runner.prefill(0, prompt_ids(PROMPT, 0, spec.vocab_size), 0)
    runner.decode_tokens([0], [1], [PROMPT])
    torch.cuda.synchronize()
    return runner, runner.graphs.graphs[runner.graphs.bucket_for(1)], runner.weights.bytes_per_token


def measure(label: str, graph, nbytes: int, holds: dict, stream) -> dict:
    """One graph on every SM, then on the free ones, then on free ones trimmed to GA10x SMs."""
    out = dict(bytes=nbytes, us=dict(all_sms=replay_us(graph.replay, stream)), hold={})
    for name, held in holds.items():
        with held:
            out["us"][name] = replay_us(graph.replay, stream)
        out["hold"][name] = held.check()
    out["gbps"] = {name: nbytes / us / 1e3 for name, us in out["us"].items()}
    us, gbps = out["us"], out["gbps"]
    print(f"  {label:28s} all SMs {us['all_sms']:7.0f} µs, {SMS_3050} SMs {us['free']:7.0f} µs,"
          f" as GA10x SMs {us['ga10x']:7.0f} µs = {gbps['ga10x']:5.0f} GB/s"
          f"  (holds ok: {all(c['ok'] for c in out['hold'].values())})", flush=True)
    return out


def run_model(model: str, recipe: str, holds: dict, stream, clock_ratio: float) -> dict:
    runner, graph, nbytes = decode_graph(model, recipe)
    print(f"Qwen2.5-{model} {recipe}: {nbytes / 1e9:.2f} GB of weights per token", flush=True)
    ours = measure("ours (3050 code and grids)", graph, nbytes, holds, stream)
    runner.close()
    del runner, graph
    fresh()
    spec = spec_of(model)
    step, peer_bytes = int4_peer_step(spec, *peer_inputs(spec))
    peer = measure("PyTorch int4 (linears only)", graphed(step), peer_bytes, holds, stream)
    del step
    fresh()
    at_3050_clock = ours["gbps"]["ga10x"] / clock_ratio
    out = dict(model=f"Qwen2.5-{model}", recipe=recipe, ours=ours, int4_tinygemm=peer,
               ours_vs_int4_ga10x=peer["us"]["ga10x"] / ours["us"]["ga10x"],
               gbps_ga10x_at_3050_clock=at_3050_clock, x_3050_dram=at_3050_clock / DRAM_3050_GBPS,
               tokens_per_s_3050_dram_ceiling=DRAM_3050_GBPS * 1e9 / nbytes)
    print(f"  ours / int4 as GA10x SMs: {out['ours_vs_int4_ga10x']:.2f}x; at the 3050's clock {at_3050_clock:.0f} GB/s"
          f" = {out['x_3050_dram']:.2f}x its DRAM; its DRAM ceiling {out['tokens_per_s_3050_dram_ceiling']:.0f} tokens/s",
          flush=True)
    return out


def copy_on(holds: dict, stream) -> dict:
    src = torch.empty(1 << 29, dtype=torch.uint8, device=DEV).random_(0, 255)  # 512 MiB
    dst = torch.empty_like(src)
    graph = graphed(lambda _i: dst.copy_(src))
    return measure("copy (read + write)", graph, 2 * src.numel(), holds, stream)


def proxy_sweep_configs(gated: bool) -> list[GemvConfig]:
    """Thirteen configs around the defaults (each is a compile of its own): 1-32 warps, 1-2
    tiles per warp, 1-2 groups per stage."""
    shapes = [(1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 4, 1), (1, 8, 1), (1, 16, 1), (1, 32, 1), (2, 4, 1), (2, 8, 1),
              (2, 16, 1), (1, 8, 2), (1, 16, 2), (2, 8, 2)]
    return [GemvConfig(tiles=t, warps=w, unroll=u) for t, w, u in shapes if not (gated and t == 1 and w % 2)]


def sweep_gemvs(held: HeldSMs, stream, rows: list[dict], save, roles: set[str]) -> None:
    """The 3B `w4` and 7B `mixed` GEMVs of these roles (qkv, o, gate_up, down, lm_head) in each
    config, batch 1, on the trimmed SMs, weights rotated so each launch reads from DRAM; each
    row appended to ``rows``, then ``save()``."""
    for model in ("3b_w4", "7b_mixed"):
        for name, bits, n, k, gated in gemv_cases(model):
            if name.split(".")[1] not in roles:
                continue
            nbytes = weight_bytes(bits, n, k)
            ws = rand_weights(bits, n, k, n_copies(nbytes))
            x = torch.randn(1, k, device=DEV).half()
            default = default_gemv_config(n // 2 if gated else n, k, gated, SMS_3050)
            shape_rows = []
            for cfg in [default] + [c for c in proxy_sweep_configs(gated) if c != default]:
                fn = gemv_fn(bits, gated, ws, x, cfg)
                graph = graphed(lambda _i, fn=fn: [fn(i) for i in range(len(ws))])
                row = dict(shape=name, bits=bits, config=vars_of(cfg), is_default=cfg == default)
                try:
                    with held:
                        us = replay_us(graph.replay, stream, launches=3, trials=3, limit_s=5.0) / len(ws)
                    row.update(us=us, gbps=nbytes / us / 1e3, hold_ok=held.check()["ok"])
                    shape_rows.append(row)
                except HoldHung:  # its block fits no trimmed SM beside the trimming block
                    row.update(fits=False)
                    if not held.release_after_hang(stream):
                        raise
                rows.append(row)
                save()
            print_best(name, shape_rows)
            del ws
            fresh()


def print_best(name: str, shape_rows: list[dict]) -> None:
    """The default config's time against the best one's (configs that did not fit are left out)."""
    if not shape_rows:
        print(f"  {name:16s} no config fitted the trimmed SMs", flush=True)
        return
    best = min(shape_rows, key=lambda r: r["us"])
    default = next((r for r in shape_rows if r["is_default"]), None)
    said = f"default {default['config']} {default['us']:8.1f} µs" if default else "default did not fit"
    ratio = f" ({default['us'] / best['us']:.2f}x)" if default else ""
    print(f"  {name:16s} {said}  best {best['config']} {best['us']:8.1f} µs{ratio}", flush=True)


def sm_clock_ghz() -> float:
    """The SM clock the GPU reports (its maximum; the H200 holds ~1.98 GHz under this load)."""
    runtime = cupy.cuda.runtime
    return runtime.deviceGetAttribute(runtime.cudaDevAttrClockRate, torch.cuda.current_device()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/proxy_3050_h200.json")
    ap.add_argument("--models", default="3B,7B")
    ap.add_argument("--sweep", action="store_true", help="also every GEMV config of the --sweep-roles")
    ap.add_argument("--sweep-roles", default="gate_up,down,lm_head", help="of qkv, o, gate_up, down, lm_head")
    args = ap.parse_args()
    require_gpu()
    emulate.build_as_ptx("86")
    emulate.plan_for_sm_count(SMS_3050)
    holds = dict(free=HeldSMs(free=SMS_3050), ga10x=HeldSMs(free=SMS_3050, ga10x=True))
    stream, clock_ghz, total = torch.cuda.Stream(), sm_clock_ghz(), holds["free"].total
    print(f"{torch.cuda.get_device_name()} ({total} SMs, {clock_ghz:.2f} GHz): {SMS_3050} left free, "
          f"the 3050's code (SM86 PTX, no programmatic launches) and grids", flush=True)
    result = dict(gpu=torch.cuda.get_device_name(), date=dt.date.today().isoformat(), commit=args.commit,
                  sms=total, free_sms=SMS_3050, clock_ghz=clock_ghz, clock_3050_ghz=CLOCK_3050_GHZ,
                  dram_3050_gbps=DRAM_3050_GBPS, models=[])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every measurement: a hang keeps what came before it
        out.write_text(json.dumps(result, indent=1))

    try:
        result["copy"] = copy_on(holds, stream)
        save()
        wanted = set(args.models.split(","))
        for model, recipe in (r for r in RUNS if r[0] in wanted):
            result["models"].append(run_model(model, recipe, holds, stream, clock_ghz / CLOCK_3050_GHZ))
            save()
        if args.sweep:
            result["gemv_sweep_ga10x"] = []
            sweep_gemvs(holds["ga10x"], stream, result["gemv_sweep_ga10x"], save, set(args.sweep_roles.split(",")))
    except HoldHung as e:
        result["hung"] = str(e)
        save()
        print(f"hung while SMs were held ({e}); what came before is in {out}", flush=True)
        os._exit(3)  # the holders never end by themselves: leave without waiting for them

if __name__ == "__main__":
    main()
