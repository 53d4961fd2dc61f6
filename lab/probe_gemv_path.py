#!/usr/bin/env python3
"""Where does a big GEMV's time go beyond reading its bytes? Ablations and timestamps.

probe_read.py found the MLP GEMVs 1.6x slower than a kernel that only reads the same bytes
with the GEMV's own grid and access pattern: the difference is inside each warp's path. This
probe compiles the GEMV source (gemv.cu, the product's text) with one part of that path
replaced by a trivial stand-in, and times each variant in a CUDA graph exactly as the product
GEMV is timed (default config, batch 1, rotating DRAM copies):

- ``no_x``: the activation loads (x, L1/L2) replaced by constants;
- ``no_scale``: the per-group scale loads replaced by 1.0;
- ``no_dequant``: the LOP3/HFMA2 decode replaced by passing the raw words on;
- ``no_mma``: the tensor-core instruction replaced by two float adds;
- ``x_shared``: x copied into shared memory once per block (the product's ``STAGE_X`` instance,
  which the launcher uses when x is at most 4 KB; here at any K); every other variant reads x
  through L1 as the product does above 4 KB;
- ``scales_shared``: a candidate fix, the block's scales copied into shared memory before the
  programmatic wait (they are constant), so the loop's only global loads are the weights;
- ``both_shared``: both;
- ``min_blocks_5`` / ``min_blocks_6``: the product's text with ``__launch_bounds__(THREADS, 5 / 6)``,
  so ptxas fits 5 / 6 blocks per SM in the registers (spilling if it must): more resident warps,
  fewer waves for the many-block shapes (the 7B gate/up: 1,184 blocks, 4 per SM, 2.24 waves).

The ablations compute wrong numbers on purpose; ``base``, the shared-memory candidates and
``stamps`` are checked bit-equal to the product GEMV of the same config. ``--sweep`` also times
``base`` and the candidates over one-tile configs (2-16 warps, 1-2 groups per stage). ``stamps``: the base kernel writing, per warp, the
global timer at entry / after the programmatic wait / after its main loop / (warp 0) after
the store, and its SM: how long warps wait to start, how long their loops take, how long the
block reduction and epilogue take, and how much of the kernel is the last warps' tail.
Results and reading: docs/history/kernels/phase-09.md.

    python -m lab.probe_gemv_path --commit SHA [--sweep] [--out docs/results/probe_gemv_path_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import DEV, KERNEL_SHAPES, gemv_cases, gemv_fn, n_copies, rand_weights, time_us, weight_bytes

from app.kernels import (
    GemvConfig, default_gemv_config, gate_up_silu_w3, gate_up_silu_w4, gemv_w3, gemv_w4, loader,
)
from app.kernels.gemv import COLUMN_BLOCK

STAMP_SLOTS = 8  # per warp: t0, t1, t2, cycles wait, cycles loop, smid, -, t3 (warp 0)
STAMP_WARPS = 1 << 17

X_LOAD = "xv[cb][v] = xrow[xoff[cb] + grp * (GROUP / 8) + v];"
PDL_WAIT = "        pdl_wait();  // the first weights are in flight; x (and y) belong to the previous kernel\n"
KERNEL_ENTRY = ("    pdl_launch_dependents();\n"
                "    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;\n")
LOOP_END = ("                    for (int c = 0; c < 4; ++c) partial[slice][(j * COLS + cb) * 4 + c][lane] = acc[j][cb][c];\n"
            "    }\n")
HELPERS = r"""
__device__ unsigned long long g_stamps[%d];
__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t) :: "memory"); return t; }
__device__ __forceinline__ unsigned long long gtime_after(float dep) {
    unsigned long long t; asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(t) : "f"(dep) : "memory"); return t; }
__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %%0, %%%%smid;" : "=r"(s)); return s; }
""" % (STAMP_WARPS * STAMP_SLOTS)


def _sub(src: str, old: str, new: str) -> str:
    if src.count(old) != 1:
        raise SystemExit(f"probe_gemv_path: anchor not found exactly once (gemv.cu changed?): {old[:60]!r}")
    return src.replace(old, new)


def _no_x(src):
    return _sub(src, X_LOAD, "xv[cb][v] = make_uint4(0x3C003C00u + grp, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u);")


def _no_scale(src):
    return _sub(src, 'asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));', "v = 0x3C00; (void)p;")


def _no_dequant(src):
    src = re.sub(r"(void w4_pairs\(const uint4& v, half2_t& a, half2_t& b\) \{).*?\n\}",
                 r"\1\n    a = u4_get(v, S / 2); b = a ^ (unsigned)S;\n}", src, count=1, flags=re.S)
    return re.sub(r"(half2_t w3_pair\(unsigned w0, unsigned w1, unsigned w2\) \{).*?\n\}",
                  r"\1\n    return P < 5 ? w0 : (P < 10 ? w1 : w2 ^ (unsigned)P);\n}", src, count=1, flags=re.S)


def _no_mma(src):
    return re.sub(r'asm\(\s*"mma\.sync\.aligned\.m16n8k16.*?\);',
                  "c[0] += __uint_as_float((a0 ^ a2 ^ b0) & 0x3FFFFFFFu); c[1] += __uint_as_float((a1 ^ a3 ^ b1) & 0x3FFFFFFFu);",
                  src, count=1, flags=re.S)


PTR_END = ("                          half0 + min(first + g + 8, N - 1), base, K, lane);\n"
           "    }\n")


def _scales_shared(src):
    """The block's scale rows copied to shared memory before the wait (constant data), read
    from there in the loop (TILES = 1 configs only: 16 rows, or 32 for the split gate/up)."""
    template = "template <int BITS, int TILES, bool GATED, int UNROLL, int COLS, int THREADS, bool STAGE_X>\n__global__"
    src = _sub(src, template, "__shared__ half_t ss_block[32 * 160];  // rows x groups, TILES = 1\n" + template)
    src = _sub(src, 'asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(p));', "v = *p;")
    return _sub(src, PTR_END, PTR_END + """\
    for (int i = threadIdx.x; i < (SPLIT ? 32 : 16) * groups; i += blockDim.x) {
        const int r = i / groups, gi = i % groups;
        const long grow = (SPLIT && r >= 16 ? (long)N : 0) + min(unit0 + (r & 15), N - 1);
        ss_block[i] = scales[grow * groups + gi];
    }
    ptr[0].s = ss_block + ((SPLIT && (warp & 1)) ? 16 + g : g) * groups;
    ptr[0].ds = 8 * groups;
    __syncthreads();
""")


SCALE_PTR = "scales + row0 * (K / GROUP), (int)(row1 - row0) * (K / GROUP)}"
SCALE_LOADS = ("            st.sc[u][j][0] = load_scale(ptr[j].s + grp);\n"
               "            st.sc[u][j][1] = load_scale(ptr[j].s + ptr[j].ds + grp);\n")


def _scale_words(src, pointer: str, group_step: str, prefetch: str):
    """Each lane's two scales of a group (rows g, g + 8) as one aligned 32-bit load from a
    rearranged scale tensor: ``pointer`` replaces the lane's scale pointer, group grp is
    ``grp * group_step`` halves on, ``prefetch`` replaces the SM90 prefetch of its scales."""
    if src.count(SCALE_PTR) != 2:
        raise SystemExit("probe_gemv_path: scale pointer anchor changed (gemv.cu)")
    src = src.replace(SCALE_PTR, pointer + ", 0}")
    src = _sub(src, SCALE_LOADS, f"            {{ const unsigned sv = load_scale2(ptr[j].s + grp * {group_step});\n"
                                 "              st.sc[u][j][0] = (half_t)(sv & 0xffffu); st.sc[u][j][1] = (half_t)(sv >> 16); }\n")
    src = _sub(src, "// One stage: the weights and scales", """__device__ __forceinline__ unsigned load_scale2(const half_t* p) {
    unsigned v;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// One stage: the weights and scales""")
    src = _sub(src, "if (t == 0) prefetch_l2(ptr[j].s + kwarp);", prefetch)
    return _sub(src, "if (t == 0) prefetch_l2(ptr[j].s + ptr[j].ds + kwarp);", "")


def _scales_tiled(src):
    """Scales in tile order, [R/16 tiles][K/128 groups][8 g][rows g, g + 8] (tiled_scales()):
    a warp's 16 scales of a group are one 32-byte sector, instead of two 16-bit loads per lane
    from 8 + 8 rows K/64 bytes apart. SM90: the tile's scales are one span of groups x 32
    bytes, and every lane asks L2 for a line of it."""
    return _scale_words(src, "scales + (first_row / 16) * (K / GROUP) * 16 + (row0 - first_row) * 2", "16",
                        "for (int i = lane; i * 64 < groups * 16; i += 32) "
                        "prefetch_l2(ptr[j].s - ((ptr[j].s - scales) & 15) + i * 64);")


def _scales_paired(src):
    """Scales with rows g and g + 8 of a tile interleaved, [R/16 tiles][8 g][K/128 groups][2]
    (paired_scales()): each lane's scales of all groups contiguous (as a row's are now, so L1
    keeps serving the groups after the first)."""
    return _scale_words(src, "scales + ((first_row / 16) * 8 + (row0 - first_row)) * (K / GROUP) * 2", "2",
                        "if (t == 0) prefetch_l2(ptr[j].s + kwarp * 2);")


def paired_scales(scales: torch.Tensor) -> torch.Tensor:
    """[R, G] (R a multiple of 16) -> the same values in _scales_paired's order."""
    r, g = scales.shape
    return scales.view(r // 16, 2, 8, g).permute(0, 2, 3, 1).contiguous()  # [tile, g8, group, h]


def tiled_scales(scales: torch.Tensor) -> torch.Tensor:
    """[R, G] (R a multiple of 16) -> the same values in tile order (see _scales_tiled)."""
    r, g = scales.shape
    v = scales.view(r // 16, 2, 8, g)  # [tile, h, g8, group]
    return v.permute(0, 3, 2, 1).contiguous()  # [tile, group, g8, h]


X_STAGED = ("x_shared", "both_shared", "no_scale_x", "scales_tiled_x", "scales_paired_x")  # launched as the STAGE_X instance



LAUNCH_BOUNDS = "__global__ void __launch_bounds__(THREADS)\n"


def _min_blocks(n: int):
    def edit(src):
        return _sub(src, LAUNCH_BOUNDS, f"__global__ void __launch_bounds__(THREADS, {n})\n")
    return edit


def _stamps(src):
    src = _sub(src, KERNEL_ENTRY, KERNEL_ENTRY +
               "    const unsigned long long _t0 = gtime(); const long long _c0 = clock64();\n"
               "    unsigned long long _t1 = 0; long long _c1 = 0;\n"
               "    unsigned long long* _st = g_stamps + ((long)blockIdx.x * nwarps + warp) * 8;\n")
    src = _sub(src, PDL_WAIT, PDL_WAIT + "        if (v == 0) { _t1 = gtime(); _c1 = clock64(); }\n")
    src = _sub(src, LOOP_END, LOOP_END +
               "    { const unsigned long long _t2 = gtime_after(acc[0][0][0]); const long long _c2 = clock64();\n"
               "      if (lane == 0) { _st[0] = _t0; _st[1] = _t1; _st[2] = _t2; _st[3] = _c1 - _c0;"
               " _st[4] = _c2 - _c1; _st[5] = smid(); } }\n")
    assert src.rstrip().endswith("}")
    body = src.rstrip()[:-1]
    return body + "    if (lane == 0) _st[7] = gtime();\n}\n"


VARIANTS = {
    "base": [], "no_x": [_no_x], "no_scale": [_no_scale], "no_dequant": [_no_dequant], "no_mma": [_no_mma],
    "x_shared": [], "scales_shared": [_scales_shared], "both_shared": [_scales_shared],
    "stamps": [_stamps], "min_blocks_5": [_min_blocks(5)], "min_blocks_6": [_min_blocks(6)],
    "no_scale_x": [_no_scale], "scales_tiled": [_scales_tiled], "scales_tiled_x": [_scales_tiled],
    "scales_paired": [_scales_paired], "scales_paired_x": [_scales_paired],
}
SCALE_LAYOUTS = {"scales_tiled": tiled_scales, "scales_tiled_x": tiled_scales,  # the scales these variants read
                 "scales_paired": paired_scales, "scales_paired_x": paired_scales}
CHECKED = ("base", "x_shared", "scales_shared", "both_shared", "stamps", "min_blocks_5", "min_blocks_6",
           "scales_tiled", "scales_tiled_x", "scales_paired", "scales_paired_x")  # variants that must still compute the product's result


def compile_variant(name: str, expression: str):
    import cupy

    src = loader.kernel_source("gemv.cu")
    for edit in VARIANTS[name]:
        src = edit(src)
    if name == "stamps":
        src = HELPERS + src
    module = cupy.RawModule(code=src, options=loader.COMPILE_OPTIONS, name_expressions=(expression,))
    return module, module.get_function(expression)


def variant_fn(kernel, variant, cfg, bits, gated, ws, x, out):
    n_out = out.shape[1]
    if variant in SCALE_LAYOUTS:
        ws = [(*w[:-1], SCALE_LAYOUTS[variant](w[-1])) for w in ws]

    def fn(i):
        w = ws[i % len(ws)]
        qa, qb, scales = (w[0], w[1], w[2]) if bits == 3 else (w[0], None, w[1])
        args = (qa.data_ptr(), qb.data_ptr() if qb is not None else 0, scales.data_ptr(), x.data_ptr(), 0, 0,
                out.data_ptr(), np.int32(x.shape[0]), np.int32(n_out), np.int32(x.shape[1]), np.int32(cfg.warps),
                0, 0, np.float32(0), 0)  # no fused norm, no chunk sums
        loader.launch(kernel, cfg.grid(n_out, gated), (32 * cfg.warps,), args,
                      shared_mem=x.numel() * 2 if variant in X_STAGED else 0)
    return fn


def stamp_summary(module, cfg, n_out: int, gated: bool) -> dict:
    """Per-warp timestamps of the last launch -> latencies in ns (percentiles over warps)."""
    import cupy

    blocks = cfg.grid(n_out, gated)[0]
    warps = blocks * cfg.warps
    mem = module.get_global("g_stamps")
    st = cupy.ndarray((STAMP_WARPS, STAMP_SLOTS), dtype=cupy.uint64, memptr=mem)[:warps].get().astype(np.int64)
    t0, t1, t2, t3 = st[:, 0], st[:, 1], st[:, 2], st[:, 7].reshape(blocks, cfg.warps)[:, 0]
    origin = t1.min()
    pct = lambda a: {p: float(np.percentile(a, p)) for p in (0, 10, 50, 90, 100)}  # noqa: E731
    return dict(
        warps=int(warps), sms=int(len(np.unique(st[:, 5]))),
        entry_before_wait_ns=pct(t1 - t0), start_lag_ns=pct(t1 - origin), loop_ns=pct(t2 - t1),
        loop_cycles=pct(st[:, 4]), end_ns=pct(t2 - origin), block_done_ns=pct(t3 - origin),
        epilogue_ns=pct(t3 - t2.reshape(blocks, cfg.warps).max(axis=1)), span_ns=float(t3.max() - origin))


def probe_shape(name, bits, n, k, gated, sms, sweep: bool, variants=tuple(VARIANTS)) -> dict:
    nbytes = weight_bytes(bits, n, k)
    ws = rand_weights(bits, n, k, n_copies(nbytes))
    x = torch.randn(1, k, device=DEV).half()
    n_out = n // 2 if gated else n
    cfg = default_gemv_config(n_out, k, gated, sms)
    row = dict(shape=name, bits=bits, n=n, k=k, config=dict(tiles=cfg.tiles, warps=cfg.warps, unroll=cfg.unroll),
               bytes=nbytes, product_us=time_us(gemv_fn(bits, gated, ws, x), graph=True), variants={}, sweep=[])
    for variant in variants:
        if variant in X_STAGED and k > 4096:
            continue
        row["variants"][variant] = measure(variant, cfg, bits, gated, ws, x, nbytes)
    if sweep:
        fixes = ("x_shared", "both_shared") if k <= 4096 else ("scales_shared",)
        for c in sweep_configs(gated):
            for variant in ("base", *fixes):
                r = measure(variant, c, bits, gated, ws, x, nbytes)
                row["sweep"].append(dict(variant=variant, tiles=c.tiles, warps=c.warps, unroll=c.unroll,
                                         is_default=c == cfg, **r))
    del ws
    torch.cuda.empty_cache()
    return row


def sweep_configs(gated: bool) -> list[GemvConfig]:
    """One tile per warp (what the shared-memory variants support), 2-16 warps, 1-2 groups per stage."""
    return [GemvConfig(tiles=1, warps=w, unroll=u) for w in (2, 4, 8, 16) for u in (1, 2)]


def measure(variant: str, cfg: GemvConfig, bits: int, gated: bool, ws, x, nbytes: int) -> dict:
    """Graph time of one variant with one config; checked against the product GEMV of that config."""
    op = {(4, False): gemv_w4, (3, False): gemv_w3, (4, True): gate_up_silu_w4, (3, True): gate_up_silu_w3}
    ref_out = op[bits, gated](x, *ws[0], config=cfg)
    module, kernel = compile_variant(variant, cfg.name_expression(bits, gated, 1, variant in X_STAGED))
    out = torch.full_like(ref_out, float("nan"))
    fn = variant_fn(kernel, variant, cfg, bits, gated, ws, x, out)
    fn(0)
    torch.cuda.synchronize()
    if variant in CHECKED:
        assert torch.equal(out, ref_out), f"{variant} {cfg}: differs from the product GEMV"
    us = time_us(fn, graph=True)
    r = dict(us_graph=us, gbps=nbytes / us / 1e3)
    if variant == "stamps":
        r["stamps"] = stamp_summary(module, cfg, out.shape[1], gated)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/probe_gemv_path_h200.json")
    ap.add_argument("--sweep", action="store_true", help="also time base and the shared-memory fixes over configs")
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), help="subset of " + ", ".join(VARIANTS))
    ap.add_argument("--only", nargs="*", default=["3b_w4.gate_up", "3b_w4.down", "7b_mixed.gate_up", "7b_mixed.down",
                                                  "3b_w4.lm_head"])
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    rows = []
    for model in KERNEL_SHAPES:
        for case in gemv_cases(model):
            if case[0] in args.only:
                rows.append(probe_shape(*case, props.multi_processor_count, args.sweep, args.variants))
                print_row(rows[-1])
    result = dict(gpu=props.name, sm_count=props.multi_processor_count, date=dt.date.today().isoformat(),
                  commit=args.commit, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


def print_row(r: dict) -> None:
    base = r["variants"]["base"]["us_graph"]
    print(f"{r['shape']:18s} product {r['product_us']:6.2f} us  " + "  ".join(
        f"{v} {d['us_graph']:6.2f} ({d['us_graph'] / base:4.2f}x)" for v, d in r["variants"].items()))
    for e in sorted(r["sweep"], key=lambda e: e["us_graph"])[:6]:
        print(f"   sweep {e['variant']:13s} warps {e['warps']:2d} unroll {e['unroll']}: {e['us_graph']:6.2f} us"
              + (" (default)" if e["is_default"] else ""))
    s = r["variants"].get("stamps", {}).get("stamps")
    if s:
        f = lambda d: "/".join(f"{d[p]:.0f}" for p in (0, 10, 50, 90, 100))  # noqa: E731
        print(f"   warps {s['warps']} on {s['sms']} SMs; ns p0/10/50/90/100: before wait {f(s['entry_before_wait_ns'])}"
              f" | start lag {f(s['start_lag_ns'])} | loop {f(s['loop_ns'])} ({f(s['loop_cycles'])} cycles)"
              f" | loop end {f(s['end_ns'])} | epilogue {f(s['epilogue_ns'])} | block done {f(s['block_done_ns'])}"
              f" | span {s['span_ns']:.0f}")


if __name__ == "__main__":
    main()
