#!/usr/bin/env python3
"""How fast can a kernel that only reads a GEMV's weight bytes be, at that size, in a graph?

The decode GEMVs are small (3B o projection 2.2 MB, gate/up 24 MB): copy bandwidth (measured
on 1 GiB) is not what a kernel of that size can reach, because it has a ramp (launch, first
round trips) and a tail. This probe gives the ceiling at each size: a streaming read of the
same bytes, from the same rotating DRAM copies bench_kernels uses, launched back to back in a
CUDA graph like the GEMV is timed, best over a sweep of grid shapes and loads in flight.
Every load comes after pdl_wait(), so each launch reads its bytes only once the one before
has finished: the ceiling of a dependent chain. (A variant with the loads before the wait
was dropped: with nothing to wait for, many launches of the chain were resident at once and
launches i and i + copies shared L2 lines, so it reported more than DRAM can deliver.)

And for the W4 shapes, ``tile_read``: the GEMV's own grid, block size and tile-group access
pattern (its default config) reading with 1-8 groups in flight per warp and no math, which
separates what the grid and access pattern cost from what the GEMV's math and reduction cost.

Printed side by side with the GEMV of the same shape (the default config, batch 1) and the
ratio GEMV / read. Nothing is checked against a reference: the read kernel XORs what it
loaded and the probe asserts the result equals the XOR computed by torch.

    python -m lab.probe_read --commit SHA [--out docs/results/probe_read_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    DEV, KERNEL_SHAPES, copy_bandwidth_gbps, gemv_cases, gemv_fn, n_copies, rand_weights, time_us, weight_bytes,
)

from app.kernels import default_gemv_config, loader

SOURCE = r"""
// XOR of every 32-bit word of p[0 .. n16) (16-byte vectors), U vectors in flight per thread.
// Each warp XORs into out (atomicXor: the order does not matter, so the result is exact).
template <int U>
__global__ void read_kernel(const uint4* __restrict__ p, long n16, unsigned* out) {
    pdl_launch_dependents();
    pdl_wait();
    const long stride = (long)gridDim.x * blockDim.x;
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = load_streaming_16(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = load_streaming_16(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out, acc);
}

// The GEMV's own grid and access pattern without its math (W4 tile layout: a tile-group is
// 1 KB, lane reads vectors lane and lane + 32): block b owns TPB consecutive tiles, warp w
// reads tile w % TPB, groups w / TPB, + W / TPB, ... with U groups in flight (all after
// pdl_wait, as the GEMV reads all but its first stage).
template <int U>
__global__ void tile_read_kernel(const uint4* __restrict__ p, int groups, int tpb, unsigned* out) {
    pdl_launch_dependents();
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int stride = nwarps / tpb;
    const uint4* tile = p + ((long)blockIdx.x * tpb + warp % tpb) * groups * 64 + lane;
    unsigned acc = 0;
    int g = warp / tpb;
    for (; g + (U - 1) * stride < groups; g += U * stride) {
        uint4 v[U][2];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            v[u][0] = load_streaming_16(tile + (g + u * stride) * 64);
            v[u][1] = load_streaming_16(tile + (g + u * stride) * 64 + 32);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            acc ^= v[u][0].x ^ v[u][0].y ^ v[u][0].z ^ v[u][0].w ^ v[u][1].x ^ v[u][1].y ^ v[u][1].z ^ v[u][1].w;
    }
    for (; g < groups; g += stride) {
        const uint4 a = load_streaming_16(tile + g * 64), b = load_streaming_16(tile + g * 64 + 32);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if (lane == 0) atomicXor(out, acc);
}
"""
TILE_UNROLLS = (1, 2, 4, 8)
UNROLLS = (2, 4, 8)
BLOCKS_PER_SM = (1, 2, 4)
THREADS = (256, 512, 1024)


def compile_read_kernels() -> dict:
    import cupy

    common = (loader.KERNEL_DIR / loader.COMMON_SOURCE).read_text(encoding="utf-8")
    names = [f"read_kernel<{u}>" for u in UNROLLS]
    tile_names = [f"tile_read_kernel<{u}>" for u in TILE_UNROLLS]
    module = cupy.RawModule(code=common + SOURCE, options=loader.COMPILE_OPTIONS, name_expressions=names + tile_names)
    kernels = {("read", u): module.get_function(f"read_kernel<{u}>") for u in UNROLLS}
    kernels.update({("tile", u): module.get_function(f"tile_read_kernel<{u}>") for u in TILE_UNROLLS})
    return kernels


def xor_of(t: torch.Tensor) -> int:
    return int(np.bitwise_xor.reduce(t.cpu().numpy().view(np.uint32)))


def read_buffers(nbytes: int, copies: int) -> list[torch.Tensor]:
    n16 = nbytes // 16
    return [torch.randint(-2**31, 2**31 - 1, (n16 * 4,), dtype=torch.int32, device=DEV) for _ in range(copies)]


def checked_us(fn, out: torch.Tensor, expected: int, what: str) -> float:
    """One launch checked against the torch XOR (``out`` is its accumulator), then the graph time."""
    out.zero_()
    fn(0)
    torch.cuda.synchronize()
    assert int(out.item()) & 0xFFFFFFFF == expected, f"{what} lost data"
    return time_us(fn, graph=True)


def best_read(kernels: dict, bufs: list[torch.Tensor], sms: int) -> dict:
    """Fastest config of the read kernel (and the whole sweep); checks the XOR of each config first."""
    out = torch.zeros(1, dtype=torch.int32, device=DEV)
    n16 = bufs[0].numel() // 4
    expected = xor_of(bufs[0])
    best, sweep = None, []
    for u in UNROLLS:
        for per_sm in BLOCKS_PER_SM:
            for threads in THREADS:
                k = kernels["read", u]
                grid = (per_sm * sms,)

                def fn(i, k=k, grid=grid, threads=threads):
                    loader.launch(k, grid, (threads,), (bufs[i % len(bufs)].data_ptr(), np.int64(n16), out.data_ptr()))

                us = checked_us(fn, out, expected, "read kernel")
                sweep.append(dict(us_graph=us, unroll=u, blocks=grid[0], threads=threads))
                if best is None or us < best["us_graph"]:
                    best = sweep[-1]
    return dict(best, sweep=sweep)


def tile_reads(kernels: dict, bufs: list[torch.Tensor], n: int, k: int, gated: bool, sms: int) -> list[dict]:
    """The GEMV's default grid (W4 tile bytes: 1 KB per 16 rows x 128 inputs) read with 1-8
    groups in flight per warp; checks the XOR of each first."""
    cfg = default_gemv_config(n // 2 if gated else n, k, gated, sms)
    tiles, groups = n // 16, k // 128
    tpb = 2 if gated else 1  # the split gate/up block owns a gate tile and an up tile
    out = torch.zeros(1, dtype=torch.int32, device=DEV)
    view = [b[: tiles * groups * 256] for b in bufs]  # 1 KB = 256 words per tile-group
    expected = xor_of(view[0])
    rows = []
    for u in TILE_UNROLLS:
        def fn(i, u=u):
            loader.launch(kernels["tile", u], (tiles // tpb,), (32 * cfg.warps,),
                          (view[i % len(view)].data_ptr(), np.int32(groups), np.int32(tpb), out.data_ptr()))

        rows.append(dict(in_flight=u, warps=cfg.warps, blocks=tiles // tpb,
                         us_graph=checked_us(fn, out, expected, "tile read kernel")))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/probe_read_h200.json")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    copy = copy_bandwidth_gbps()
    kernels = compile_read_kernels()
    rows = []
    for model in KERNEL_SHAPES:
        for name, bits, n, k, gated in gemv_cases(model):
            nbytes = weight_bytes(bits, n, k)
            copies = n_copies(nbytes)
            ws = rand_weights(bits, n, k, copies)
            x = torch.randn(1, k, device=DEV).half()
            gemv_us = time_us(gemv_fn(bits, gated, ws, x), graph=True)
            del ws
            bufs = read_buffers(nbytes, copies)
            row = dict(shape=name, bytes=nbytes, gemv_us=gemv_us,
                       read=best_read(kernels, bufs, sms))
            if bits == 4 and n % 32 == 0:
                row["tile_read"] = tile_reads(kernels, bufs, n, k, gated, sms)
            del bufs
            torch.cuda.empty_cache()
            d = row["read"]
            d["gbps"] = nbytes / d["us_graph"] / 1e3
            d["frac_copy"] = d["gbps"] / copy
            row["gemv_gbps"] = nbytes / gemv_us / 1e3
            row["gemv_over_read"] = gemv_us / d["us_graph"]
            rows.append(row)
            print(f"{name:18} {nbytes / 2**20:7.1f} MiB  gemv {gemv_us:7.2f} us ({row['gemv_gbps']:5.0f} GB/s)  "
                  f"read only {d['us_graph']:7.2f} us ({d['gbps']:5.0f} GB/s, {100 * d['frac_copy']:3.0f} % of copy)  "
                  f"gemv / read {row['gemv_over_read']:.2f}x", flush=True)
            for t in row.get("tile_read", []):
                print(f"{'':18} the GEMV's grid ({t['blocks']} x {t['warps']} warps), read only, {t['in_flight']} "
                      f"groups in flight per warp: {t['us_graph']:7.2f} us", flush=True)
    result = dict(gpu=props.name, sm_count=sms, date=dt.datetime.now(dt.timezone.utc).isoformat(), commit=args.commit,
                  copy_gbps=copy, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"copy bandwidth {copy:.0f} GB/s on {props.name}")


if __name__ == "__main__":
    main()
