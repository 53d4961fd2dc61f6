#!/usr/bin/env python3
"""Kernel micro-benchmarks (llm.c dev/cuda style): time, GB/s and fraction of copy bandwidth.

For each kernel on real Qwen2.5-3B / 7B shapes: median time per launch from CUDA events,
plain (back-to-back eager launches, Python launch cost included) and graph-replayed (the
launch gaps stripped), rotating over enough weight copies that nothing is served from L2.
Peers in the same run: torch fp16 matmul (cuBLAS) and torch's int4 tinygemm
(``_weight_int4pack_mm``, group 128) on the same shapes, and whole linear-layer stacks.

    python -m benchmarks.bench_kernels [--quick] [--commit SHA] [--out docs/results/kernels_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from app.kernels import (
    DecodeAttentionWorkspace, GemvConfig, decode_attention, default_gemv_config, default_num_splits, rms_norm,
    rope_kv_write,
)
from benchmarks.common import (
    DEV, GEMV_OPS, KERNEL_SHAPES, copy_bandwidth_gbps, gemv_cases, gemv_fn, n_copies, rand_weights, require_gpu,
    time_us, vars_of, weight_bytes,
)


def bench_gemv(copy_gbps: float, quick: bool, sms: int, only: list[str] | None = None) -> tuple[list, list]:
    rows, sweep = [], []
    for model in KERNEL_SHAPES:
        for name, bits, n, k, gated in gemv_cases(model):
            if only and name not in only:
                continue
            nbytes = weight_bytes(bits, n, k)
            ws = rand_weights(bits, n, k, n_copies(nbytes))
            n_out = n // 2 if gated else n
            default = default_gemv_config(n_out, k, gated, sms)
            for m in (1, 4, 8):
                x = torch.randn(m, k, device=DEV).half()
                fn = gemv_fn(bits, gated, ws, x)
                us_g, us_e = time_us(fn, graph=True), time_us(fn, graph=False)
                gbps = nbytes / us_g / 1e3
                rows.append(dict(shape=name, bits=bits, n=n, k=k, m=m, config=vars_of(default), us_graph=us_g,
                                 us_eager=us_e, gbps=gbps, frac_copy=gbps / copy_gbps))
            if quick:
                continue
            x = torch.randn(1, k, device=DEV).half()
            for cfg in sweep_configs(gated):
                us = time_us(gemv_fn(bits, gated, ws, x, cfg), graph=True)
                sweep.append(dict(shape=name, bits=bits, m=1, config=vars_of(cfg), us_graph=us,
                                  gbps=nbytes / us / 1e3, is_default=cfg == default))
            del ws
            torch.cuda.empty_cache()
    return rows, sweep


def sweep_configs(gated: bool) -> list[GemvConfig]:
    """Tiles 1-2 per warp, 1-16 warps per block, 1-4 groups per stage (4 tiles were never
    faster in the earlier sweeps), and the 32-warp block (one tile, one group per stage).
    Gated with one tile per warp needs an even number of warps."""
    out = []
    for tiles in (1, 2):
        for warps in (1, 2, 4, 8, 16):
            for unroll in (1, 2, 4):
                if tiles * unroll <= 4 and not (gated and tiles == 1 and warps % 2):
                    out.append(GemvConfig(tiles=tiles, warps=warps, unroll=unroll))
    return out + [GemvConfig(tiles=1, warps=32, unroll=1)]


def bench_peers(copy_gbps: float) -> list:
    rows = []
    for model in KERNEL_SHAPES:
        for name, _, n, k, _gated in gemv_cases(model):
            copies = n_copies(n * k * 2)
            x = torch.randn(1, k, device=DEV).half()
            w16 = [torch.randn(n, k, device=DEV).half() for _ in range(copies)]
            us = time_us(lambda i: torch.matmul(x, w16[i % copies].T), graph=True)
            rows.append(dict(shape=name, peer="torch_fp16_cublas", us_graph=us, gbps=n * k * 2 / us / 1e3,
                             frac_copy=n * k * 2 / us / 1e3 / copy_gbps))
            del w16
            rows.append(int4_peer(name, n, k, copy_gbps))
            torch.cuda.empty_cache()
    return rows


def int4_peer(name: str, n: int, k: int, copy_gbps: float) -> dict:
    try:
        q = torch.randint(0, 16, (n, k), dtype=torch.int32, device=DEV)
        try:  # torch >= 2.5 takes two nibbles per uint8
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        except RuntimeError:
            packed = torch.ops.aten._convert_weight_to_int4pack(q, 8)
        del q
        nbytes = n * k // 2 + n * (k // 128) * 4
        copies = n_copies(nbytes)
        packs = [packed] + [packed.clone() for _ in range(copies - 1)]
        sz = torch.rand(k // 128, n, 2, device=DEV).to(torch.bfloat16)
        x = torch.randn(1, k, device=DEV).to(torch.bfloat16)
        us = time_us(lambda i: torch.ops.aten._weight_int4pack_mm(x, packs[i % copies], 128, sz), graph=True)
        return dict(shape=name, peer="torch_int4pack_mm_g128", us_graph=us, gbps=nbytes / us / 1e3,
                    frac_copy=nbytes / us / 1e3 / copy_gbps)
    except (RuntimeError, NotImplementedError) as e:
        return dict(shape=name, peer="torch_int4pack_mm_g128", error=str(e).splitlines()[0][:200])


def bench_small_ops(copy_gbps: float, sms: int) -> list:
    rows = []
    for model, c in KERNEL_SHAPES.items():
        h, d, hq, hkv = c["hidden"], c["d"], c["hq"], c["hkv"]
        for m in (1, 4):
            xs = [torch.randn(m, h, device=DEV).half() for _ in range(8)]
            w = torch.rand(h, device=DEV).half()
            res = torch.randn(m, h, device=DEV).half()
            us = time_us(lambda i: rms_norm(xs[i % 8], w, 1e-6, residual=res, residual_out=res), graph=True)
            rows.append(dict(op="rms_norm+residual", model=model, m=m, us_graph=us))
            qkv = torch.randn(m, (hq + 2 * hkv) * d, device=DEV).half()
            cos = torch.rand(4096, d, device=DEV)
            kc = torch.zeros(m, hkv, 4096, d, device=DEV).half()
            vc = torch.zeros_like(kc)
            pos = torch.arange(m, dtype=torch.int32, device=DEV) * 7
            slots = torch.arange(m, dtype=torch.int32, device=DEV)
            us = time_us(lambda i: rope_kv_write(qkv, cos, cos, pos, slots, kc, vc, num_q_heads=hq, num_kv_heads=hkv),
                         graph=True)
            rows.append(dict(op="rope_kv_write", model=model, m=m, us_graph=us))
        for ctx in (1024, 4096, 32768):
            for batch in (1, 4):
                kc = torch.randn(batch, hkv, ctx, d, device=DEV).half()
                vc = torch.randn_like(kc)
                q = torch.randn(batch, hq, d, device=DEV).half()
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
                slots = torch.arange(batch, dtype=torch.int32, device=DEV)
                ws = DecodeAttentionWorkspace.allocate(batch, hq, d, default_num_splits(hkv, ctx, sms), DEV)
                us = time_us(lambda i: decode_attention(q, kc, vc, lens, slots, workspace=ws), graph=True)
                nbytes = 2 * kc.numel() * 2
                rows.append(dict(op="decode_attention", model=model, ctx=ctx, batch=batch, splits=ws.num_splits,
                                 us_graph=us, gbps=nbytes / us / 1e3, frac_copy=nbytes / us / 1e3 / copy_gbps))
                del kc, vc
    return rows


def bench_linear_stack(model: str, copy_gbps: float) -> dict:
    """Graph of every linear layer of one decode step (distinct weights per layer), batch 1."""
    c = KERNEL_SHAPES[model]
    layers = []
    total = 0
    for _ in range(c["layers"]):
        layer = []
        for _name, bits, n, k, gated in gemv_cases(model)[:4]:
            (w,) = rand_weights(bits, n, k, 1)
            layer.append((bits, gated, w, n // 2 if gated else n))
            total += weight_bytes(bits, n, k)
        layers.append(layer)
    _name, hbits, hn, hk, _ = gemv_cases(model)[4]
    (head,) = rand_weights(hbits, hn, hk, 1)
    total += weight_bytes(hbits, hn, hk)
    x = torch.randn(1, c["hidden"], device=DEV).half()
    xi = torch.randn(1, c["inter"], device=DEV).half()
    ops = GEMV_OPS

    inputs = (x, x, x, xi)  # qkv, o (hq * d == hidden for Qwen), gate_up, down

    def step(_i):
        for layer in layers:
            for inp, (bits, gated, w, _n) in zip(inputs, layer):
                ops[bits, gated](inp, *w)
        ops[hbits, False](x, *head)

    us = time_us(step, graph=True, launches=1, trials=20)
    return dict(model=model, bytes=total, us_graph=us, tokens_per_s=1e6 / us, gbps=total / us / 1e3,
                frac_copy=total / us / 1e3 / copy_gbps, kernels=4 * c["layers"] + 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the config sweep")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/kernels_h200.json")
    ap.add_argument("--only", action="append", help="GEMV shape (e.g. 3b_w4.down; repeatable): only those, "
                    "GEMVs only (no peers, small ops or linear stacks)")
    args = ap.parse_args()
    require_gpu()
    props = torch.cuda.get_device_properties(0)
    copy = copy_bandwidth_gbps()
    print(f"{props.name}, {props.multi_processor_count} SMs, copy {copy:.0f} GB/s", flush=True)
    result = dict(gpu=props.name, sm_count=props.multi_processor_count, date=dt.datetime.now(dt.timezone.utc).isoformat(),
                  git_commit=args.commit, torch=torch.__version__, cupy=_cupy_version(), copy_gbps=copy)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result["gemv"], result["gemv_sweep"] = bench_gemv(copy, args.quick, props.multi_processor_count, args.only)
    out.write_text(json.dumps(result, indent=1) + "\n")  # the sweep is the long part: keep it if the rest fails
    if args.only:
        print_sweep(result)
        return
    result["peers"] = bench_peers(copy)
    result["small_ops"] = bench_small_ops(copy, props.multi_processor_count)
    result["linear_stacks"] = [bench_linear_stack(m, copy) for m in KERNEL_SHAPES]
    out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)


def _cupy_version() -> str:
    import cupy

    return cupy.__version__


def print_table(r: dict) -> None:
    peer = {(p["shape"], p["peer"]): p for p in r["peers"]}
    print(f"\n{'shape':18} {'b':>1} {'M':>1} {'graph us':>9} {'eager us':>9} {'GB/s':>6} {'copy%':>5}"
          f" | {'fp16 us':>8} {'int4 us':>8}")
    for g in r["gemv"]:
        fp16 = peer.get((g["shape"], "torch_fp16_cublas"), {}).get("us_graph", float("nan"))
        i4 = peer.get((g["shape"], "torch_int4pack_mm_g128"), {}).get("us_graph", float("nan"))
        print(f"{g['shape']:18} {g['bits']:>1} {g['m']:>1} {g['us_graph']:9.2f} {g['us_eager']:9.2f} {g['gbps']:6.0f}"
              f" {100 * g['frac_copy']:5.1f} | {fp16 if g['m'] == 1 else float('nan'):8.2f}"
              f" {i4 if g['m'] == 1 else float('nan'):8.2f}")
    print_sweep(r)
    for o in r["small_ops"]:
        extra = f" ctx={o['ctx']} B={o['batch']} {o['gbps']:.0f} GB/s" if "ctx" in o else f" M={o['m']}"
        print(f"{o['op']:18} {o['model']:8}{extra} {o['us_graph']:.2f} us")
    for s in r["linear_stacks"]:
        print(f"linear stack {s['model']}: {s['us_graph']:.0f} us/token = {s['tokens_per_s']:.0f} tok/s, "
              f"{s['gbps']:.0f} GB/s ({100 * s['frac_copy']:.0f}% of copy), {s['kernels']} kernels")
    print(f"copy bandwidth {r['copy_gbps']:.0f} GB/s on {r['gpu']}")


def print_sweep(r: dict) -> None:
    """Each shape's default (M = 1) and every swept config, fastest first, with its ratio to the default."""
    by_shape: dict[str, list] = {}
    for s in r["gemv_sweep"]:
        by_shape.setdefault(s["shape"], []).append(s)
    for shape, rows in by_shape.items():
        default = next((s for s in rows if s["is_default"]), None)
        for s in sorted(rows, key=lambda s: s["us_graph"])[:6]:
            ratio = default["us_graph"] / s["us_graph"] if default else float("nan")
            print(f"sweep {shape:18} {s['config']} {s['us_graph']:.2f} us {s['gbps']:.0f} GB/s "
                  f"{ratio:.2f}x the default{' (default)' if s['is_default'] else ''}")


if __name__ == "__main__":
    main()
