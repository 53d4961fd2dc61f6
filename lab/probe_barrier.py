#!/usr/bin/env python3
"""What a dependent phase costs: a kernel boundary in a CUDA graph vs a grid barrier inside one
persistent kernel (the question behind a persistent per-layer decode kernel, docs/history/kernels/phase-07.md).

Both sides run the same chain of P dependent phases over a grid of ``blocks`` (default: one
per SM, all resident): in every phase each block reads one value the previous phase wrote
(the sum over all blocks, so every phase depends on every block of the one before) and
writes its own. Side A: P kernels captured in one graph (programmatic launches where the
GPU has them, and plain). Side B: one kernel whose blocks meet at a counter barrier
(``atom.add.release.gpu`` + ``ld.acquire.gpu`` polling) between phases. Both check that the
last phase saw the expected sum, then print microseconds per phase and write JSON.

    python -m lab.probe_barrier --out docs/results/probe_barrier_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
from pathlib import Path

import numpy as np
import torch

from app.kernels import loader, programmatic

SOURCE = r"""
// One phase: every block sums the previous phase's values (one per block), adds 1 and writes
// its own; after P phases each value is sum-dependent on all earlier phases.
__device__ __forceinline__ float gather(const float* prev, int n) {
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += prev[i];
    s = warp_sum(s);
    __shared__ float part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) t += part[w];
    __syncthreads();
    return t;
}

extern "C" __global__ void phase_kernel(const float* prev, float* next) {
    pdl_launch_dependents();
    pdl_wait();
    const float s = gather(prev, gridDim.x);
    if (threadIdx.x == 0) next[blockIdx.x] = s * (1.f / gridDim.x) + 1.f;
}

__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// bufs: [phases + 1][gridDim.x]; counter zeroed before the launch.
extern "C" __global__ void persistent_kernel(float* bufs, unsigned* counter, int phases) {
    pdl_launch_dependents();
    pdl_wait();
    for (int p = 0; p < phases; ++p) {
        const float s = gather(bufs + (long)p * gridDim.x, gridDim.x);
        if (threadIdx.x == 0) bufs[(long)(p + 1) * gridDim.x + blockIdx.x] = s * (1.f / gridDim.x) + 1.f;
        grid_barrier(counter, (unsigned)(p + 1) * gridDim.x);
    }
}
"""


def compile_kernels():
    import cupy

    common = (loader.KERNEL_DIR / loader.COMMON_SOURCE).read_text(encoding="utf-8")
    module = cupy.RawModule(code=common + SOURCE, options=loader.COMPILE_OPTIONS)
    return module.get_function("phase_kernel"), module.get_function("persistent_kernel")


def time_graph(fn, reps: int = 20) -> float:
    """Microseconds per replay of ``fn`` captured in a CUDA graph (median of reps)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return float(np.median(times))


def expected(phases: int) -> float:
    """Phase 0 values are all 1 and every phase adds 1 to the mean of the one before."""
    return 1.0 + phases


def run(blocks: int, threads: int, phases: int) -> dict:
    phase_k, persistent_k = compile_kernels()
    bufs = torch.ones(phases + 1, blocks, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = {}

    def chain():
        for p in range(phases):
            loader.launch(phase_k, (blocks,), (threads,), (bufs[p].data_ptr(), bufs[p + 1].data_ptr()))

    def persistent():
        counter.zero_()
        loader.launch(persistent_k, (blocks,), (threads,), (bufs.data_ptr(), counter.data_ptr(), np.int32(phases)))

    for mode in ("on", "off"):
        programmatic.set_mode(mode)
        if mode == "on" and not programmatic.enabled(torch.cuda.get_device_capability()):
            continue
        bufs[1:].fill_(-1.0)
        out[f"kernels_pdl_{mode}_us_per_phase"] = time_graph(chain) / phases
        assert torch.allclose(bufs[-1], torch.full_like(bufs[-1], expected(phases))), bufs[-1][:4]
    programmatic.set_mode("auto")
    bufs[1:].fill_(-1.0)
    total = time_graph(persistent)
    assert torch.allclose(bufs[-1], torch.full_like(bufs[-1], expected(phases))), bufs[-1][:4]
    # the counter reset is one memset node of ~2 us in the same graph: subtract a measured one
    empty = time_graph(lambda: counter.zero_())
    out["barrier_us_per_phase"] = (total - empty) / phases
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phases", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for per_sm, threads in ((1, 256), (1, 512), (2, 256), (4, 128)):
        r = {"blocks": per_sm * sms, "threads": threads, **run(per_sm * sms, threads, args.phases)}
        rows.append(r)
        ratio = r.get("kernels_pdl_on_us_per_phase", r["kernels_pdl_off_us_per_phase"]) / r["barrier_us_per_phase"]
        print(f"blocks {r['blocks']:4d} x {threads:3d}: kernels (pdl on) "
              f"{r.get('kernels_pdl_on_us_per_phase', float('nan')):.2f} us, (off) "
              f"{r['kernels_pdl_off_us_per_phase']:.2f} us, barrier {r['barrier_us_per_phase']:.2f} us "
              f"per phase -> kernel/barrier {ratio:.2f}x", flush=True)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    result = {"gpu": torch.cuda.get_device_name(), "sms": sms, "date": datetime.datetime.now(datetime.UTC).isoformat(),
              "commit": commit, "phases": args.phases, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
