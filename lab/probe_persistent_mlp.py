#!/usr/bin/env python3
"""Can one persistent kernel that streams weights across the phase boundaries beat the chain of
GEMV kernels? (docs/history/kernels/phase-21.md; the kernel is lab/persistent_mlp.cu.)

L layers of the 3B `w4` MLP at batch 1 (h = h + silu(RMSNorm(h) Wg^T) * (RMSNorm(h) Wu^T) Wd^T,
distinct synthetic weights per layer, 1.2 GB for 36 layers: read from DRAM), side by side:
- the product's chain: per layer the gate/up GEMV with the fused norm and the down GEMV with the
  residual and chunk sums (app.kernels.gemv, programmatic launches where the GPU has them), in
  one CUDA graph;
- the persistent kernel: one block per SM for the whole run, weights streamed through a ring of
  shared-memory slots per warp, a grid counter between phases (several ring depths; the weights
  in the tile layout or stored once more as records, phase 22's compact per-warp runs the
  leanest; ablations without the math, without waiting, without fences).
Correctness first: both against the PyTorch reference chain (app.kernels.reference) over the
first layers, outputs poisoned before the runs; the persistent kernel run twice is bit-equal.
Prints µs per layer, GB/s and the fraction of the copy bandwidth measured in the same run, and
writes JSON.

    python -m lab.probe_persistent_mlp --commit $(git rev-parse --short HEAD) \\
        --out docs/results/probe_persistent_mlp_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import copy_bandwidth_gbps, time_us
from lab.persistent_records import DEV, HIDDEN, INTER, WARPS, build_records
from lab.probe_read import compile_read_kernels

from app.kernels import loader
from app.kernels.gemv import FusedNorm, gate_up_silu_w4, gemv_w4
from app.kernels.reference import (
    gate_up_silu_w4_ref, gemv_w4_ref, norm_chunk_sums_ref, rms_norm_chunked_ref,
)
from app.kernels.w4_tiles import repack_w4_tiles

EPS = 1e-6
SLOT_BYTES = 72 * 16  # a ring slot (persistent_stream.cu SLOT_VECS): 1 KB of W4 + up to 128 B of scales
EXTRA_SHARED = 8 * WARPS * 32 * 4 + WARPS * 16 * 4  # partial sums (A_UNITS_MAX units, B)
KERNEL_FILES = [Path(__file__).resolve().parent / f for f in ("persistent_stream.cu", "persistent_mlp.cu")]


def persistent_source(files: list[Path]) -> str:
    """common.cu and gemv.cu (the loader's text), then the probe's files: what NVRTC compiles."""
    return loader.kernel_source("gemv.cu") + "".join(f'\n#line 1 "{f.name}"\n' + f.read_text() for f in files)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """[N, G] -> [N/16, G, 16]: a piece's 16 rows of scales contiguous (32 B)."""
    n, groups = scales.shape
    return scales.view(n // 16, 16, groups).permute(0, 2, 1).contiguous()


def random_w4(n: int, k: int, scale: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Checkpoint W4 (qweight [N, K/8] int32, scales [N, K/128] fp16) with random nibbles."""
    q = torch.randint(-2**31, 2**31 - 1, (n, k // 8), dtype=torch.int32, generator=gen, device=DEV)
    s = (torch.rand(n, k // 128, generator=gen, device=DEV) * scale + scale / 3).half()
    return q, s


def build(layers: int, seed: int) -> dict:
    """Per layer: the checkpoint weights (for the reference) and the GPU layouts, also stacked."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    w = {"ckpt": [], "gu": [], "gu_s": [], "gu_st": [], "dn": [], "dn_s": [], "dn_st": [], "norm": []}
    for _ in range(layers):
        gq, gs = random_w4(2 * INTER, HIDDEN, 0.006, gen)
        dq, ds = random_w4(HIDDEN, INTER, 0.002, gen)
        w["ckpt"].append((gq, gs, dq, ds))
        w["gu"].append(repack_w4_tiles(gq))
        w["gu_s"].append(gs)
        w["gu_st"].append(tile_scales(gs))
        w["dn"].append(repack_w4_tiles(dq))
        w["dn_s"].append(ds)
        w["dn_st"].append(tile_scales(ds))
        w["norm"].append((1 + 0.1 * torch.randn(HIDDEN, generator=gen, device=DEV)).half())
    for key in ("gu", "gu_st", "dn", "dn_st", "norm"):
        w[key + "_all"] = torch.stack(w[key]).contiguous()
    return w


def reference_chain(w: dict, h: torch.Tensor, layers: int) -> torch.Tensor:
    """The unfused PyTorch rounding (norm, gate/up, down) layer by layer: [1, H] fp16."""
    h = h.clone()
    for ell, (gq, gs, dq, ds) in enumerate(w["ckpt"][:layers]):
        x = rms_norm_chunked_ref(h, w["norm"][ell], EPS)
        a = gate_up_silu_w4_ref(x, gq, gs)
        h = gemv_w4_ref(a, dq, ds, residual=h)
    return h


def product_chain(w: dict, h: torch.Tensor, sums: torch.Tensor, a: torch.Tensor, layers: int):
    """The product's kernels: fused-norm gate/up, then down with residual and chunk sums."""
    def run(_i=0):
        for ell in range(layers):
            gate_up_silu_w4(h, w["gu"][ell], w["gu_s"][ell], norm=FusedNorm(w["norm"][ell], sums, EPS), out=a)
            gemv_w4(a, w["dn"][ell], w["dn_s"][ell], residual=h, out=h, sums_out=sums)
    return run


LAYOUTS = ("", ", records in sweep order", ", records per warp", ", lane records, compact runs")  # LAYOUT 0-3


def variant_name(ring: int, math: bool, bulk: bool, layout: int = 0, pieces: int = 1) -> str:
    copy = "bulk copies (SM90)" if bulk else "cp.async"
    return (f"persistent, ring {ring}, {copy}" + LAYOUTS[layout]
            + (f", {pieces} pieces a take" if pieces > 1 else "")
            + ("" if math else ", no dequant/mma (ablation)"))
















def compile_persistent(ring: int, math: bool = True, bulk: bool = False, pieces: int = 1, layout: int = 0):
    """The kernel instance; math=False is the ablation without dequantization and mma, bulk=True
    fills the ring with SM90 bulk copies instead of cp.async, pieces=2 takes two pieces a slot,
    layout: the weights' (LAYOUTS)."""
    import cupy

    code = persistent_source(KERNEL_FILES)
    flag = lambda v: "true" if v else "false"  # noqa: E731
    name = f"persistent_mlp_kernel<{ring}, {flag(math)}, {flag(bulk)}, {pieces}, {layout}>"
    module = cupy.RawModule(code=code, options=loader.COMPILE_OPTIONS, name_expressions=(name,))
    return module.get_function(name)


def shared_bytes(ring: int) -> int:
    return WARPS * ring * (SLOT_BYTES + 8) + EXTRA_SHARED + INTER * 2  # + one mbarrier per slot


def persistent_chain(kernel, ring: int, w: dict, h, sums, a, counter, layers: int, stamps=None,
                     ablate: int = 0, records: tuple | None = None):
    blocks = loader.sm_count(h.device)
    if blocks < HIDDEN // 16 or -(-(INTER // 16) // blocks) > 8:
        raise SystemExit(f"the probe's kernel needs 128 to {INTER // 16} SMs with <= 8 units each, got {blocks}")
    shared = shared_bytes(ring)
    if loader.resident_blocks(kernel, 32 * WARPS, shared) < 1:
        raise SystemExit(f"ring {ring}: {shared} B of shared memory do not fit a block on this GPU")
    steps, gu, region, starts = (0, w["gu_all"], 0, None) if records is None else records
    args = (gu.data_ptr(), w["gu_st_all"].data_ptr(), w["dn_all"].data_ptr(), w["dn_st_all"].data_ptr(),
            w["norm_all"].data_ptr(), h.data_ptr(), sums.data_ptr(), a.data_ptr(), counter.data_ptr(),
            np.int32(layers), np.int32(HIDDEN), np.int32(INTER), np.float32(EPS),
            0 if stamps is None else stamps.data_ptr(), np.int32(ablate), np.int32(steps), np.int32(region),
            0 if starts is None else starts.data_ptr())

    def run(_i=0):
        counter.zero_()
        loader.launch(kernel, (blocks,), (32 * WARPS,), args, shared_mem=shared)
    return run


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref.float()).abs().max() / ref.float().abs().max())


def check(w: dict, kernels: dict, layers: int, seed: int) -> dict:
    """Both chains against the reference over `layers` layers, from a fresh random h."""
    gen = torch.Generator(device=DEV).manual_seed(seed + 1)
    h0 = torch.randn(1, HIDDEN, generator=gen, device=DEV).half()
    ref = reference_chain(w, h0, layers)
    out = {"layers": layers, "ref_absmax": float(ref.float().abs().max())}

    def fresh():
        h = h0.clone()
        a = torch.full((1, INTER), float("nan"), dtype=torch.float16, device=DEV)  # poisoned
        return h, norm_chunk_sums_ref(h).contiguous(), a

    h, sums, a = fresh()
    product_chain(w, h, sums, a, layers)()
    out["product_rel_err"] = rel_err(h, ref)
    for name, (ring, kernel, rec) in kernels.items():
        counter = torch.zeros(1, dtype=torch.int32, device=DEV)
        results = []
        for _ in range(2):
            h, sums, a = fresh()
            persistent_chain(kernel, ring, w, h, sums, a, counter, layers, records=w["records"][rec] if rec else None)()
            torch.cuda.synchronize()
            assert not torch.isnan(a).any(), f"{name}: a left poisoned"
            results.append((h.clone(), sums.clone()))
        err = rel_err(results[0][0], ref)
        out[f"{name}: rel_err"] = err
        out[f"{name}: repeat_bit_equal"] = bool(torch.equal(results[0][0], results[1][0]))
        out[f"{name}: sums_match"] = bool(torch.equal(results[0][1], norm_chunk_sums_ref(results[0][0])))
        assert out[f"{name}: repeat_bit_equal"], f"{name}: two runs differ"
        assert out[f"{name}: sums_match"], f"{name}: chunk sums are not h's"
        assert err < 4 * max(out["product_rel_err"], 1e-3), f"{name}: rel err {err:.2e} vs product {out['product_rel_err']:.2e}"
    return out


def timing(w: dict, kernels: dict, layers: int, copy_gbps: float) -> list[dict]:
    h = torch.randn(1, HIDDEN, device=DEV).half()
    sums = norm_chunk_sums_ref(h).contiguous()
    a = torch.empty(1, INTER, dtype=torch.float16, device=DEV)
    counter = torch.zeros(1, dtype=torch.int32, device=DEV)
    layer_bytes = (2 * INTER * HIDDEN + HIDDEN * INTER) // 2 + (2 * INTER * HIDDEN // 128 + HIDDEN * INTER // 128) * 2
    sides = {"product chain (gemv.cu, graphed)": product_chain(w, h, sums, a, layers)}
    read_k = compile_read_kernels()["read", 8]
    blocks = 2 * loader.sm_count(h.device)

    def pure_read(_i=0):  # the same weight and scale bytes, read by probe_read.py's read kernel
        for t in (w["gu_all"], w["gu_st_all"], w["dn_all"], w["dn_st_all"]):
            loader.launch(read_k, (blocks,), (1024,), (t.data_ptr(), np.int64(t.numel() * t.element_size() // 16),
                                                       counter.data_ptr()))
    sides["pure read of the same bytes (probe_read.py, 2 x 1,024 threads per SM)"] = pure_read
    for name, (ring, kernel, rec) in kernels.items():
        records = w["records"][rec] if rec else None
        sides[name] = persistent_chain(kernel, ring, w, h, sums, a, counter, layers, records=records)
        # Ablations (wrong results): never waiting for the other blocks (a pure stream), and
        # arriving without a fence (phase 22: fences cost 0.4-1.7 µs under a saturated stream).
        for ablate, suffix in ABLATIONS:
            sides[name + suffix] = persistent_chain(kernel, ring, w, h, sums, a, counter, layers,
                                                    ablate=ablate, records=records)
    rows = []
    for name, fn in sides.items():
        us = time_us(fn, graph=True, launches=2, trials=15)
        gbps = layers * layer_bytes / us / 1e3
        rows.append({"side": name, "us_total": us, "us_per_layer": us / layers, "gb_per_s": gbps,
                     "copy_fraction": gbps / copy_gbps})
    base = rows[0]["us_total"]
    for r in rows:
        r["speedup_vs_product"] = base / r["us_total"]
    return rows


ABLATIONS = ((1, ", free run"), (2, ", no fence"), (3, ", free run, no fence"))
STAMP_NAMES = ("A waited", "A pieces done", "A arrived", "B waited", "a staged", "B pieces done", "B arrived")


def stamp_summary(stamps: torch.Tensor) -> dict:
    """Where a layer's time goes, from the blocks' globaltimer stamps [L, 7, G] (ns; 0 where a
    block has no down tile): median µs of each step over blocks and layers, the barriers' latency
    (a phase's median wait end after the previous phase's last arrival) and the layer period."""
    t = stamps.double().cpu() / 1e3  # µs
    has_b = t[:, 3] > 0  # [L, G]
    med = lambda x: float(x.median()) if x.numel() else float("nan")  # noqa: E731
    out = {
        "A: waited -> pieces done": med(t[:, 1] - t[:, 0]),
        "A: pieces done -> arrived (reduce, silu, fence)": med(t[:, 2] - t[:, 1]),
        "B: waited -> a staged": med((t[:, 4] - t[:, 3])[has_b]),
        "B: a staged -> pieces done": med((t[:, 5] - t[:, 4])[has_b]),
        "B: pieces done -> arrived (reduce, residual, fence)": med((t[:, 6] - t[:, 5])[has_b]),
    }
    last_a = t[:, 2].max(dim=1).values  # [L]
    last_b = t[:, 6].max(dim=1).values
    b_wait = torch.tensor([med(t[i, 3][has_b[i]]) for i in range(t.shape[0])], dtype=torch.float64)
    out["barrier before B (median wait end - last A arrival)"] = med(b_wait - last_a)
    out["barrier before A (median wait end - last B arrival of the layer before)"] = med(t[1:, 0].median(dim=1).values - last_b[:-1])
    out["spread of A arrivals (last - first)"] = med(t[:, 2].max(dim=1).values - t[:, 2].min(dim=1).values)
    out["layer period (last A arrival to the next)"] = med(last_a[1:] - last_a[:-1])
    return out


def stamped_run(w: dict, kernel, ring: int, layers: int, records=None) -> dict:
    h = torch.randn(1, HIDDEN, device=DEV).half()
    sums = norm_chunk_sums_ref(h).contiguous()
    a = torch.empty(1, INTER, dtype=torch.float16, device=DEV)
    counter = torch.zeros(1, dtype=torch.int32, device=DEV)
    stamps = torch.zeros(layers, len(STAMP_NAMES), loader.sm_count(h.device), dtype=torch.int64, device=DEV)
    run = persistent_chain(kernel, ring, w, h, sums, a, counter, layers, stamps, records=records)
    run()  # warm
    torch.cuda.synchronize()
    stamps.zero_()
    run()
    torch.cuda.synchronize()
    return stamp_summary(stamps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--check-layers", type=int, default=4)
    # (phase 21 ran 4:1:0,11:1:0,11:1:0:1,11:0:0,11:0:0:1; 11 slots no longer fit once a slot
    # holds lane records, phase 22)
    ap.add_argument("--variants", default="3:1:0:0:1,3:1:0:3:1,3:1:0:3:2,3:0:0:3:1",
                    help="ring:math:bulk[:layout[:pieces a take]] to compile, check (math ones) and time; "
                         "layout 0 tiles, 1 records in sweep order, 2 records per warp, 3 compact lane records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    defaults = (0, 1)  # layout, pieces a take
    variants = [(*v, *defaults[len(v) - 3:]) for v in (tuple(int(x) for x in t.split(":")) for t in args.variants.split(","))]
    bulk_ok = torch.cuda.get_device_capability() >= (9, 0)
    if any(v[4] > 1 and (v[2] or v[3] not in (0, 3)) for v in variants):
        raise SystemExit("two pieces a take: cp.async and the tile or run layouts only")
    # the ring's shared memory is counted in pieces: ring x pieces a take
    # values: (ring x pieces, the kernel, the key of its records in w["records"] or 0)
    kernels = {variant_name(r, bool(m), bool(b), lay, p): (r * p, compile_persistent(r, bool(m), bool(b), p, lay),
                                                           (lay, p) if lay else 0)
               for r, m, b, lay, p in variants if bulk_ok or not b}
    w = build(args.layers, args.seed)
    w["records"] = {key: build_records(w, loader.sm_count(torch.device(DEV)), *key)
                    for key in {key for _, _, key in kernels.values() if key}}
    checked = check(w, {k: v for k, v in kernels.items() if "ablation" not in k}, args.check_layers, args.seed)
    print(json.dumps(checked, indent=1))
    copy_gbps = copy_bandwidth_gbps()
    rows = timing(w, kernels, args.layers, copy_gbps)
    print(f"copy {copy_gbps:.0f} GB/s; {args.layers} layers of the 3B w4 MLP, batch 1")
    print(f"{'side':66} {'us/layer':>9} {'GB/s':>6} {'copy%':>6} {'x product':>9}")
    for r in rows:
        print(f"{r['side']:66} {r['us_per_layer']:9.2f} {r['gb_per_s']:6.0f} {100 * r['copy_fraction']:6.1f}"
              f" {r['speedup_vs_product']:9.2f}")
    stamps = {}
    for name, (ring, kernel, rec) in kernels.items():
        if "ablation" in name:
            continue
        stamps[name] = stamped_run(w, kernel, ring, args.layers, w["records"][rec] if rec else None)
    print("one stamped run each (µs, medians over blocks and layers):")
    label = lambda n: (n.replace("persistent, ring ", "r").replace(", bulk copies (SM90)", " bulk")  # noqa: E731
                       .replace(", cp.async", " cp").replace(", records in sweep order", " rec").replace(", records per warp", " wrec")
                       .replace(", lane records, compact runs", " run").replace(" pieces a take", "/take"))
    print(f"  {'':60} " + " ".join(f"{label(n):>14}" for n in stamps))
    for k in next(iter(stamps.values())):
        print(f"  {k[:60]:60} " + " ".join(f"{st[k]:14.2f}" for st in stamps.values()))
    result = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
              "commit": args.commit, "torch": torch.__version__, "copy_gb_per_s": copy_gbps,
              "layers": args.layers, "check": checked, "rows": rows, "stamps_us": stamps}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
