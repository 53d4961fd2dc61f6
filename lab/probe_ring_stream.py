#!/usr/bin/env python3
"""How fast can one resident block per SM stream weights through per-warp rings?
(docs/history/kernels/phase-21.md: the persistent MLP's stream, without its math and phases, peaked at ~2.9 TB/s where
a plain read of the same bytes reaches ~4.2.)

Every warp reads 1 KB pieces (two 16-byte vectors per lane, the W4 tile-group shape) of a 512 MiB
buffer, in one of two orders: `sweep` (piece i of warp w at i * warps + w: the whole GPU walks the
buffer together, like a plain read) or `own` (each warp a contiguous region). Mechanisms:
- `ring`: cp.async into a shared-memory ring of RING slots per warp, one commit group per piece,
  `wait_group RING - 1` before using the oldest (the persistent MLP's stream);
- `regs`: the same pieces loaded into registers, D pieces in flight per warp (the GEMV's way).
Grid: one or two blocks per SM, 8-32 warps each. Each config's XOR of all words is checked against the host
before it is timed; prints GB/s and the fraction of the copy bandwidth measured in the same run.

    python -m lab.probe_ring_stream --commit $(git rev-parse --short HEAD) \\
        --out docs/results/probe_ring_stream_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import copy_bandwidth_gbps, time_us

from app.kernels import loader

DEV = "cuda"
SOURCE = r"""
constexpr int PIECE_VECS = 64;  // 1 KB

__device__ __forceinline__ long piece_at(long i, int gw, int warps, long per_warp, bool sweep) {
    return sweep ? i * warps + gw : (long)gw * per_warp + i;
}

__device__ __forceinline__ unsigned fold(uint4 a, uint4 b) { return a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w; }

// One warp's ring over its per_warp pieces (piece i at p + at(i) pieces): one commit group per
// piece, `wait_group RING - 1` before using the oldest; the XOR of every word it read (this lane's).
template <int RING, class At>
__device__ __forceinline__ unsigned ring_xor(const uint4* p, long per_warp, uint4* ring, int lane, At at) {
    auto issue = [&](long i) {
        if (i < per_warp) {
            const uint4* src = p + at(i) * PIECE_VECS;
            uint4* dst = ring + (i % RING) * PIECE_VECS;
            cp_async_16(dst + lane, src + lane);
            cp_async_16(dst + 32 + lane, src + 32 + lane);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    for (int i = 0; i < RING - 1; ++i) issue(i);
    unsigned acc = 0;
    for (long i = 0; i < per_warp; ++i) {
        __syncwarp();
        issue(i + RING - 1);
        asm volatile("cp.async.wait_group %0;" :: "n"(RING - 1) : "memory");
        const uint4* s = ring + (i % RING) * PIECE_VECS;
        acc ^= fold(s[lane], s[32 + lane]);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    return acc;
}

template <int RING>
__global__ void ring_kernel(const uint4* __restrict__ p, long per_warp, int sweep, unsigned* out) {
    extern __shared__ uint4 ring_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int gw = blockIdx.x * nw + warp, warps = gridDim.x * nw;
    unsigned acc = ring_xor<RING>(p, per_warp, ring_smem + warp * RING * PIECE_VECS, lane,
                                  [&](long i) { return piece_at(i, gw, warps, per_warp, sweep); });
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(out, acc);
}

template <int D>
__global__ void regs_kernel(const uint4* __restrict__ p, long per_warp, int sweep, unsigned* out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int gw = blockIdx.x * nw + warp, warps = gridDim.x * nw;
    unsigned acc = 0;
    for (long i = 0; i < per_warp; i += D) {  // per_warp is a multiple of D (the launcher)
        uint4 v[D][2];
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const uint4* src = p + piece_at(i + d, gw, warps, per_warp, sweep) * PIECE_VECS;
            v[d][0] = load_streaming_16(src + lane);
            v[d][1] = load_streaming_16(src + 32 + lane);
        }
#pragma unroll
        for (int d = 0; d < D; ++d) acc ^= fold(v[d][0], v[d][1]);
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(out, acc);
}
"""
RINGS = (2, 4, 8, 12)
DEPTHS = (1, 2, 4, 8)
WARPS = (8, 16, 32)


def compile_kernels() -> dict:
    import cupy

    names = [f"ring_kernel<{r}>" for r in RINGS] + [f"regs_kernel<{d}>" for d in DEPTHS]
    common = (loader.KERNEL_DIR / loader.COMMON_SOURCE).read_text(encoding="utf-8")
    module = cupy.RawModule(code=common + SOURCE, options=loader.COMPILE_OPTIONS, name_expressions=names)
    kernels = {("ring", r): module.get_function(f"ring_kernel<{r}>") for r in RINGS}
    kernels.update({("regs", d): module.get_function(f"regs_kernel<{d}>") for d in DEPTHS})
    return kernels


def run(kernels: dict, buf: torch.Tensor, copy_gbps: float) -> list[dict]:
    pieces = buf.numel() * 4 // 1024
    out = torch.zeros(1, dtype=torch.int32, device=DEV)
    rows = []
    for (mech, depth), kernel in kernels.items():
        for warps, per_sm in ((w, p) for w in WARPS for p in (1, 2)):
            shared = warps * depth * 1024 if mech == "ring" else 0
            if per_sm * warps > 32 or loader.resident_blocks(kernel, 32 * warps, shared) < per_sm:
                continue
            blocks = per_sm * loader.sm_count(buf.device)
            per_warp = pieces // (blocks * warps) // 8 * 8  # a multiple of every depth
            nbytes = per_warp * blocks * warps * 1024
            for sweep in (1, 0):
                args = (buf.data_ptr(), np.int64(per_warp), np.int32(sweep), out.data_ptr())

                def fn(_i=0, kernel=kernel, warps=warps, shared=shared, args=args, blocks=blocks):
                    loader.launch(kernel, (blocks,), (32 * warps,), args, shared_mem=shared)

                out.zero_()
                fn()
                torch.cuda.synchronize()
                want = xor_prefix(buf, per_warp * blocks * warps)
                assert (int(out.item()) & 0xFFFFFFFF) == want, f"{mech} {depth} warps {warps}: lost data"
                us = time_us(fn, graph=True, launches=3, trials=10)
                gbps = nbytes / us / 1e3
                rows.append({"mechanism": mech, "depth": depth, "warps": warps, "blocks_per_sm": per_sm,
                             "order": "sweep" if sweep else "own",
                             "us": us, "gb_per_s": gbps, "copy_fraction": gbps / copy_gbps})
    return rows


_xor_cache: dict[int, int] = {}


def xor_prefix(buf: torch.Tensor, pieces: int) -> int:
    """XOR of the words of the first ``pieces`` pieces: what either order of a launch reads."""
    if pieces not in _xor_cache:
        _xor_cache[pieces] = int(np.bitwise_xor.reduce(buf[: pieces * 256].cpu().numpy().view(np.uint32)))
    return _xor_cache[pieces]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    kernels = compile_kernels()
    buf = torch.randint(-2**31, 2**31 - 1, (args.mib << 18,), dtype=torch.int32, device=DEV)
    copy_gbps = copy_bandwidth_gbps()
    rows = run(kernels, buf, copy_gbps)
    print(f"copy {copy_gbps:.0f} GB/s; {args.mib} MiB in 1 KB pieces")
    print(f"{'mechanism':9} {'depth':>5} {'warps':>5} {'/SM':>3} {'order':>5} {'us':>8} {'GB/s':>6} {'copy%':>6}")
    for r in sorted(rows, key=lambda r: -r["gb_per_s"]):
        print(f"{r['mechanism']:9} {r['depth']:5} {r['warps']:5} {r['blocks_per_sm']:3} {r['order']:>5} {r['us']:8.1f}"
              f" {r['gb_per_s']:6.0f}"
              f" {100 * r['copy_fraction']:6.1f}")
    result = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit,
              "torch": torch.__version__, "copy_gb_per_s": copy_gbps, "mib": args.mib, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
