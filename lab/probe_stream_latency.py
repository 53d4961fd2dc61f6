#!/usr/bin/env python3
"""What does a weight stream do to the latency of the loads and fences around it?
(docs/history/kernels/phase-22.md: inside the persistent kernels the latency-bound steps — the norm's sums, staging `a`,
the attention's partials, the release after a phase — took 1-4 µs each while the rings streamed,
and the layer kernel's attention phases ran slower than the product's own kernels.)

One block per SM: S warps stream 1 KB pieces of a buffer (the persistent kernels' per-warp
cp.async ring, RING slots; RING 0: they stay idle) in the GPU-wide sweep order, three passes, the
XOR of every word checked against the host. One more warp measures, while the stream runs
(globaltimer, ns, medians over the blocks):
- `l2_hop`: a dependent chain of `ld.global.cg` over 32 hot lines (an activation in L2);
- `dram_hop`: a dependent chain over 128 MB of random lines (a miss: the weights' own latency);
- `fence`: `__threadfence()` with nothing in flight; `fence_cp8`: the same right after the warp
  issued 8 pieces of cp.async (does a fence wait for the ring?);
- `release`: `red.release.gpu.add` (a phase's arrival);
- `probe_done_before_stream`: the measuring warp finished while the stream still ran.

    python -m lab.probe_stream_latency --commit $(git rev-parse --short HEAD) \\
        --out docs/results/probe_stream_latency_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import copy_bandwidth_gbps, time_us
from lab.probe_ring_stream import SOURCE as RING_SOURCE

from app.kernels import loader

DEV = "cuda"
SOURCE = r"""
constexpr int LINE_WORDS = 32;  // one node of a chain per 128-byte line
constexpr int OUTS = 8;         // per block: l2, dram, fence, fence_cp8, release, probe end, -, -

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    return t;
}

__device__ __forceinline__ unsigned ld_cg(const unsigned* p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The streaming warps: the persistent kernels' ring (take piece i: issue i + RING - 1, wait for i).
// The streaming warps: probe_ring_stream.py's ring (the persistent kernels' stream), the GPU-wide
// sweep order wrapping around the buffer.
template <int RING>
__device__ void stream(const uint4* p, long npieces, long per_warp, uint4* ring, int gw, int warps, int lane,
                       unsigned* xor_out, unsigned long long* stream_end) {
    unsigned acc = ring_xor<RING>(p, per_warp, ring, lane, [&](long i) { return (i * warps + gw) % npieces; });
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) {
        atomicXor(xor_out, acc);
        atomicMax(stream_end, now_ns());
    }
}

// The measuring warp (lane 0 times; the whole warp issues the fence_cp8 pieces).
__device__ void measure(const uint4* p, long npieces, const unsigned* hot, const unsigned* cold, int hops,
                        uint4* scratch, unsigned* counter, unsigned long long* out, unsigned* sink, int lane) {
    const unsigned long long start = now_ns();
    while (now_ns() < start + 5000) {}  // let the stream get going
    unsigned v = 0, keep = 0;
    unsigned long long t0 = now_ns();
    for (int h = 0; h < hops; ++h) v = ld_cg(hot + (long)v * LINE_WORDS);
    out[0] = (now_ns() - t0) / hops;
    keep ^= v;
    v = 0;
    t0 = now_ns();
    for (int h = 0; h < hops; ++h) v = ld_cg(cold + (long)v * LINE_WORDS);
    out[1] = (now_ns() - t0) / hops;
    keep ^= v;
    constexpr int F = 32;
    unsigned long long fence = 0, fence_cp = 0, release = 0;
    for (int f = 0; f < F; ++f) {
        __syncwarp();
        t0 = now_ns();
        __threadfence();
        fence += now_ns() - t0;
        for (int k = 0; k < 8; ++k) {  // 8 pieces in flight, as a ring's warp has
            const uint4* src = p + ((long)(f * 8 + k) * 7919 % npieces) * PIECE_VECS;
            cp_async_16(scratch + k * PIECE_VECS + lane, src + lane);
            cp_async_16(scratch + k * PIECE_VECS + 32 + lane, src + 32 + lane);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        t0 = now_ns();
        __threadfence();
        fence_cp += now_ns() - t0;
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        __syncwarp();
        keep ^= scratch[lane].x;
        t0 = now_ns();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counter) : "memory");
        release += now_ns() - t0;
    }
    out[2] = fence / F;
    out[3] = fence_cp / F;
    out[4] = release / F;
    out[5] = now_ns();
    if (lane == 0) atomicXor(sink, keep);
}

template <int RING>
__global__ void latency_kernel(const uint4* __restrict__ p, long npieces, long per_warp, const unsigned* hot,
                               const unsigned* cold, int hops, unsigned* counter, unsigned long long* outs,
                               unsigned* xor_out, unsigned* sink, unsigned long long* stream_end) {
    extern __shared__ uint4 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, streamers = (blockDim.x >> 5) - 1;
    if (warp == streamers) {
        unsigned long long out[OUTS] = {};
        measure(p, npieces, hot, cold, hops, smem, counter, out, sink, lane);
        if (lane == 0)
            for (int k = 0; k < OUTS; ++k) outs[blockIdx.x * OUTS + k] = out[k];
    } else if constexpr (RING > 0) {
        stream<RING>(p, npieces, per_warp, smem + (8 + warp * RING) * PIECE_VECS, blockIdx.x * streamers + warp,
                     gridDim.x * streamers, lane, xor_out, stream_end);
    }
}
"""
RINGS = (0, 2, 4, 8, 12)
STREAMERS = (8, 16)
PASSES = 3  # odd: the stream's XOR is the buffer's


def compile_kernels() -> dict:
    import cupy

    names = [f"latency_kernel<{r}>" for r in RINGS]
    common = (loader.KERNEL_DIR / loader.COMMON_SOURCE).read_text(encoding="utf-8")
    module = cupy.RawModule(code=common + RING_SOURCE + SOURCE, options=loader.COMPILE_OPTIONS, name_expressions=names)
    return {r: module.get_function(f"latency_kernel<{r}>") for r in RINGS}


def chain(nodes: int, gen: torch.Generator) -> torch.Tensor:
    """A random cycle through `nodes` 128-byte lines: word 0 of line i holds the next line."""
    order = torch.randperm(nodes, generator=gen)
    nxt = torch.empty(nodes, dtype=torch.int64)
    nxt[order] = torch.roll(order, -1)
    lines = torch.zeros(nodes, 32, dtype=torch.int32)
    lines[:, 0] = nxt.to(torch.int32)
    return lines.reshape(-1).to(DEV)


def run_config(kernel, ring: int, streamers: int, buf: torch.Tensor, hot: torch.Tensor, cold: torch.Tensor,
               hops: int) -> dict:
    blocks = loader.sm_count(buf.device)
    npieces = buf.numel() * 4 // 1024 // (blocks * streamers) * (blocks * streamers)
    per_warp = PASSES * npieces // (blocks * streamers) if ring else 0
    outs = torch.zeros(blocks, 8, dtype=torch.int64, device=DEV)
    small = torch.zeros(4, dtype=torch.int32, device=DEV)  # counter, xor, sink, -
    stream_end = torch.zeros(1, dtype=torch.int64, device=DEV)
    shared = (8 + streamers * ring) * 1024
    args = (buf.data_ptr(), np.int64(npieces), np.int64(per_warp), hot.data_ptr(), cold.data_ptr(), np.int32(hops),
            small.data_ptr(), outs.data_ptr(), small[1:].data_ptr(), small[2:].data_ptr(), stream_end.data_ptr())

    def fn(_i=0):
        loader.launch(kernel, (blocks,), (32 * (streamers + 1),), args, shared_mem=shared)

    fn()
    torch.cuda.synchronize()
    if ring:
        want = int(np.bitwise_xor.reduce(buf[: npieces * 256].cpu().numpy().view(np.uint32)))
        assert (int(small[1].item()) & 0xFFFFFFFF) == want, f"ring {ring} x {streamers}: the stream lost data"
    o = outs.cpu().numpy()
    med = lambda k: float(np.median(o[:, k]))  # noqa: E731
    row = {"ring": ring, "streamers": streamers, "l2_hop_ns": med(0), "dram_hop_ns": med(1), "fence_ns": med(2),
           "fence_cp8_ns": med(3), "release_ns": med(4)}
    if ring:
        row["probe_done_before_stream"] = bool(o[:, 5].max() < int(stream_end.item()))
        us = time_us(fn, graph=True, launches=2, trials=5)
        row["stream_gb_per_s"] = per_warp * blocks * streamers * 1024 / us / 1e3
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--hops", type=int, default=64)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    kernels = compile_kernels()
    gen = torch.Generator().manual_seed(0)
    buf = torch.randint(-2**31, 2**31 - 1, (args.mib << 18,), dtype=torch.int32, device=DEV)
    hot, cold = chain(32, gen), chain(1 << 20, gen)
    copy_gbps = copy_bandwidth_gbps()
    rows = [run_config(kernels[r], r, s, buf, hot, cold, args.hops) for s in STREAMERS for r in RINGS]
    print(f"copy {copy_gbps:.0f} GB/s; one block per SM: streaming warps + one measuring warp; ns medians over blocks")
    print(f"{'ring':>4} {'warps':>5} {'GB/s':>6} {'copy%':>6} {'L2 hop':>7} {'DRAM hop':>8} {'fence':>6}"
          f" {'fence+8cp':>9} {'release':>7}  probe inside stream")
    for r in rows:
        gb = r.get("stream_gb_per_s", 0.0)
        print(f"{r['ring']:4} {r['streamers']:5} {gb:6.0f} {100 * gb / copy_gbps:6.1f} {r['l2_hop_ns']:7.0f}"
              f" {r['dram_hop_ns']:8.0f} {r['fence_ns']:6.0f} {r['fence_cp8_ns']:9.0f} {r['release_ns']:7.0f}"
              f"  {r.get('probe_done_before_stream', '-')}")
    result = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit,
              "torch": torch.__version__, "copy_gb_per_s": copy_gbps, "mib": args.mib, "hops": args.hops,
              "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
