#!/usr/bin/env python3
"""The RTX 3050 Laptop's decode step as near as an H200 gets: its code, its grids, 16 SMs.

The product targets a 16-SM SM86 card that the team does not have. This probe runs the decode
step the way that card would: kernels built as SM86 PTX with programmatic launches off
(app.kernels.emulate.build_as_ptx), every grid and attention split planned for 16 SMs
(emulate.plan_for_sm_count), and the step replayed while all other SMs are held by one block
each that takes the SM's whole shared memory (so no other block fits beside it; a probe
kernel's blocks, launched meanwhile, must land only on the free SMs, which is checked).

What it shows: the rate at which 16 SMs running our kernels consume the step's weight bytes,
next to the rate of a plain copy and of PyTorch's int4 kernel (linears only) on the same 16 SMs.
The 3050 has 192 GB/s of DRAM; where 16 SMs at the 3050's clock consume bytes faster than
that, the card's DRAM, not the kernels, bounds its speed. What it cannot show: the 3050's DRAM
efficiency, its 2 MB L2 (the H200's 60 MB L2 stays shared by all SMs) and its 100 KB of shared
memory per SM.

    python3 benchmarks/probe_3050_proxy.py --commit SHA [--out docs/results/proxy_3050_h200.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")  # nothing may load lazily while SMs are held

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import cupy  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_decode import DEV, PROMPT, fresh, int4_peer_step, peer_inputs, prompt_ids, spec_of  # noqa: E402

from app.engine.cuda.runner import runner_for_weights  # noqa: E402
from app.engine.cuda.synthetic import synthetic_weights  # noqa: E402
from app.kernels import emulate  # noqa: E402
from app.quant.recipe import BUILTIN_RECIPES  # noqa: E402

SMS_3050 = 16
DRAM_3050_GBPS = 192.0
CLOCK_3050_GHZ = 1.5  # a laptop 3050's sustained clock (boost 1.5-1.74 GHz by the maker's power limit)
RUNS = [("3B", "w4"), ("7B", "mixed")]

HOLD_SOURCE = r"""
extern "C" __global__ void hold_sm(const volatile int* release, int* smids) {
    extern __shared__ int whole_sm[];  // all of the SM's shared memory: no other block fits beside it
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        smids[blockIdx.x] = (int)smid;
        while (*release == 0) __nanosleep(2000);
        whole_sm[0] = (int)smid;
    }
}
extern "C" __global__ void where_blocks_ran(int* smids) {
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        smids[blockIdx.x] = (int)smid;
    }
}
"""


class HeldSMs:
    """All but ``free`` SMs held, one block each, inside ``with``. Nothing may synchronize the
    whole device in between: time with events on a stream (:func:`replay_us`)."""

    def __init__(self, free: int):
        props = cupy.cuda.runtime.getDeviceProperties(torch.cuda.current_device())
        self.total = props["multiProcessorCount"]
        self.held = self.total - free
        module = cupy.RawModule(code=HOLD_SOURCE, options=("-std=c++17",))
        self.hold, self.where = module.get_function("hold_sm"), module.get_function("where_blocks_ran")
        self.smem = props["sharedMemPerBlockOptin"]
        self.hold.max_dynamic_shared_size_bytes = self.smem
        self.release = cupy.ones(1, cupy.int32)
        self.held_smids = cupy.full(self.held, -1, cupy.int32)
        self.probe_smids = cupy.full(8 * self.total, -1, cupy.int32)
        self.hold_stream, self.side = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
        self._launch_all()  # warm: every kernel loaded before any SM is held
        cupy.cuda.Device().synchronize()

    def _launch_all(self) -> None:
        self._hold()
        self._probe()
        with self.side:
            self.release.fill(1)

    def _hold(self) -> None:
        with self.hold_stream:
            self.hold((self.held,), (32,), (self.release, self.held_smids), shared_mem=self.smem)

    def _probe(self) -> None:
        with self.side:
            self.where((self.probe_smids.size,), (32,), (self.probe_smids,))

    def __enter__(self) -> HeldSMs:
        self.release.fill(0)
        self.held_smids.fill(-1)
        self.probe_smids.fill(-1)
        cupy.cuda.Device().synchronize()
        self._hold()
        self._probe()
        self.side.synchronize()  # the probe ran while the holders were resident
        return self

    def __exit__(self, *exc) -> None:
        with self.side:
            self.release.fill(1)
        cupy.cuda.Device().synchronize()

    def check(self) -> dict:
        """Were the SMs held as meant: distinct held SMs, and the probe's blocks only elsewhere."""
        held, probed = set(self.held_smids.get().tolist()), set(self.probe_smids.get().tolist())
        return dict(sms=self.total, held=len(held), probe_sms=len(probed), overlap=len(held & probed),
                    ok=len(held) == self.held and not held & probed and -1 not in held)


def replay_us(replay, stream: torch.cuda.Stream, launches: int = 10, trials: int = 5) -> float:
    """Median µs per call of ``replay()`` on ``stream``, timed with events only."""
    samples = []
    with torch.cuda.stream(stream):
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for _ in range(launches):
                replay()
            end.record(stream)
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(samples)


def graphed(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(0)  # warm: cuBLAS / kernel selection outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(0)
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


def measure(label: str, graph, nbytes: int, held: HeldSMs, stream) -> dict:
    """One graph on every SM, then on the free ones."""
    whole = replay_us(graph.replay, stream)
    with held:
        few = replay_us(graph.replay, stream)
    check = held.check()
    out = dict(us_all_sms=whole, us_free_sms=few, bytes=nbytes, gbps_all_sms=nbytes / whole / 1e3,
               gbps_free_sms=nbytes / few / 1e3, hold=check)
    print(f"  {label:28s} all SMs {whole:8.1f} µs  {SMS_3050} SMs {few:8.1f} µs = {out['gbps_free_sms']:6.0f} GB/s"
          f"  (held {check['held']}, probe overlap {check['overlap']})", flush=True)
    return out


def run_model(model: str, recipe: str, held: HeldSMs, stream, clock_ratio: float) -> dict:
    runner, graph, nbytes = decode_graph(model, recipe)
    print(f"Qwen2.5-{model} {recipe}: {nbytes / 1e9:.2f} GB of weights per token", flush=True)
    ours = measure("ours (3050 code and grids)", graph, nbytes, held, stream)
    runner.close()
    del runner, graph
    fresh()
    spec = spec_of(model)
    step, peer_bytes = int4_peer_step(spec, *peer_inputs(spec))
    peer = measure("PyTorch int4 (linears only)", graphed(step), peer_bytes, held, stream)
    del step
    fresh()
    at_3050_clock = ours["gbps_free_sms"] / clock_ratio
    out = dict(model=f"Qwen2.5-{model}", recipe=recipe, ours=ours, int4_tinygemm=peer,
               ours_vs_int4_free_sms=peer["us_free_sms"] / ours["us_free_sms"],
               gbps_free_sms_at_3050_clock=at_3050_clock, x_3050_dram=at_3050_clock / DRAM_3050_GBPS,
               tokens_per_s_3050_dram_ceiling=DRAM_3050_GBPS * 1e9 / nbytes)
    print(f"  ratio ours / int4 on {SMS_3050} SMs: {out['ours_vs_int4_free_sms']:.2f}x;"
          f" at the 3050's clock {at_3050_clock:.0f} GB/s = {out['x_3050_dram']:.2f}x its DRAM;"
          f" its DRAM ceiling {out['tokens_per_s_3050_dram_ceiling']:.0f} tokens/s", flush=True)
    return out


def copy_on(held: HeldSMs, stream) -> dict:
    src = torch.empty(1 << 29, dtype=torch.uint8, device=DEV).random_(0, 255)  # 512 MiB
    dst = torch.empty_like(src)
    graph = graphed(lambda _i: dst.copy_(src))
    return measure("copy (read + write)", graph, 2 * src.numel(), held, stream)


def sm_clock_ghz() -> float:
    """The SM clock the GPU reports (its maximum; the H200 holds ~1.98 GHz under this load)."""
    runtime = cupy.cuda.runtime
    return runtime.deviceGetAttribute(runtime.cudaDevAttrClockRate, torch.cuda.current_device()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/proxy_3050_h200.json")
    ap.add_argument("--models", default="3B,7B")
    args = ap.parse_args()
    emulate.build_as_ptx("86")
    emulate.plan_for_sm_count(SMS_3050)
    held, stream = HeldSMs(free=SMS_3050), torch.cuda.Stream()
    clock_ghz = sm_clock_ghz()
    print(f"{torch.cuda.get_device_name()} ({held.total} SMs, {clock_ghz:.2f} GHz): {SMS_3050} left free, "
          f"the 3050's code (SM86 PTX, no programmatic launches) and grids", flush=True)
    result = dict(gpu=torch.cuda.get_device_name(), date=dt.date.today().isoformat(), commit=args.commit,
                  sms=held.total, free_sms=SMS_3050, clock_ghz=clock_ghz, clock_3050_ghz=CLOCK_3050_GHZ,
                  dram_3050_gbps=DRAM_3050_GBPS, copy=copy_on(held, stream), models=[])
    wanted = set(args.models.split(","))
    for model, recipe in (r for r in RUNS if r[0] in wanted):
        result["models"].append(run_model(model, recipe, held, stream, clock_ghz / CLOCK_3050_GHZ))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
