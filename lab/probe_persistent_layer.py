#!/usr/bin/env python3
"""A whole decode layer as one persistent kernel against the product's chain of kernels
(docs/history/kernels/phase-21.md; the kernel is lab/persistent_layer.cu).

L layers of Qwen2.5-3B `w4` at batch 1, the token at position `pos` over a KV cache of random
earlier positions (distinct synthetic weights per layer, 1.3 GB: read from DRAM), side by side:
- the product's chain per layer: qkv GEMV with the fused norm and bias, `rope_decode_attention`
  (RoPE, cache write, split + combine), o GEMV with the residual and chunk sums, the fused-norm
  gate/up, the down GEMV (app.kernels, programmatic launches where the GPU has them), one graph;
- the persistent kernel: six phases per layer, every warp streaming its qkv, o, gate/up and down
  pieces through one ring across them.
Correctness first: both against the PyTorch reference (app.kernels.reference) over the first
layers (h, and the k / v written at pos), outputs poisoned before the runs, the persistent
kernel run twice bit-equal. Prints µs per layer, the per-phase stamps, and writes JSON.

    python -m lab.probe_persistent_layer --commit $(git rev-parse --short HEAD) \\
        --out docs/results/probe_persistent_layer_h200.json
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import copy_bandwidth_gbps, time_us
from lab.persistent_records import DEV, WARPS, step_index, stored_records
from lab.probe_persistent_mlp import (
    EPS, EXTRA_SHARED, SLOT_BYTES, persistent_source, random_w4, rel_err, tile_scales,
)

from app.kernels import loader
from app.kernels.attention import DecodeAttentionWorkspace, default_num_splits, rope_decode_attention
from app.kernels.gemv import FusedNorm, gate_up_silu_w4, gemv_w4
from app.kernels.reference import (
    decode_attention_ref, gate_up_silu_w4_ref, gemv_w4_ref, norm_chunk_sums_ref, rms_norm_chunked_ref,
    rope_kv_write_ref,
)
from app.kernels.w4_tiles import repack_w4_tiles

H, I, HQ, HKV, D = 2048, 11008, 16, 2, 128  # Qwen2.5-3B
NQKV = (HQ + 2 * HKV) * D
KERNEL_FILES = [Path(__file__).resolve().parent / f for f in ("persistent_stream.cu", "persistent_layer.cu")]
STAMPS = ("qkv", "attention split", "combine", "o", "gate/up", "down")  # each: waited, arrived


class Layers:
    """Weights (checkpoint for the reference, tiles for the kernels), norms, caches and RoPE tables."""

    def __init__(self, layers: int, max_len: int, pos: int, seed: int):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        self.n, self.max_len, self.pos = layers, max_len, pos
        self.ckpt = []  # per layer: (qkv, o, gate/up, down) as (qweight, scales)
        tiles = {k: [] for k in ("qkv", "qkv_s", "o", "o_s", "gu", "gu_s", "dn", "dn_s")}
        for _ in range(layers):
            mats = (random_w4(NQKV, H, 0.004, gen), random_w4(H, H, 0.002, gen),
                    random_w4(2 * I, H, 0.004, gen), random_w4(H, I, 0.0015, gen))
            self.ckpt.append(mats)
            for name, (q, s) in zip(("qkv", "o", "gu", "dn"), mats):
                tiles[name].append(repack_w4_tiles(q))
                tiles[name + "_s"].append(s)
        self.tiles = tiles  # per layer, for the product's launchers
        self.stacked = {k: torch.stack([tile_scales(s) for s in v]) if k.endswith("_s") else torch.stack(v)
                        for k, v in tiles.items()}
        self.bias = (0.1 * torch.randn(layers, NQKV, generator=gen, device=DEV)).half()
        self.ln1 = (1 + 0.1 * torch.randn(layers, H, generator=gen, device=DEV)).half()
        self.ln2 = (1 + 0.1 * torch.randn(layers, H, generator=gen, device=DEV)).half()
        self.k0 = torch.zeros(layers, 1, HKV, max_len, D, dtype=torch.float16, device=DEV)  # [L, slot, Hkv, len, D]
        self.v0 = torch.zeros_like(self.k0)
        self.k0[:, :, :, :pos] = torch.randn(layers, 1, HKV, pos, D, generator=gen, device=DEV).half()
        self.v0[:, :, :, :pos] = torch.randn(layers, 1, HKV, pos, D, generator=gen, device=DEV).half()
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=DEV).float() / D))
        angles = torch.arange(max_len, device=DEV).float()[:, None] * inv_freq[None]  # [len, D/2]
        self.cos, self.sin = angles.cos().contiguous(), angles.sin().contiguous()
        self.h0 = torch.randn(1, H, generator=gen, device=DEV).half()


def layer_record_sources(blocks: int) -> tuple[int, torch.Tensor]:
    """The pieces in the order persistent_layer.cu's LayerStream takes them (step_index). A
    layer's pieces: qkv, o, gate/up tile-groups (tile * H/128 + group), then the down ones."""
    gh, gi, tiles_h, units, qkv_tiles = H // 128, I // 128, H // 16, I // 16, NQKV // 16
    o0 = qkv_tiles * gh
    gu0 = o0 + tiles_h * gh
    dn0 = gu0 + 2 * units * gh
    seqs = {}
    for b in range(blocks):
        n_q = max(0, -(-(qkv_tiles - b) // blocks))
        otile = (b + tiles_h) % blocks
        n_a = -(-(units - b) // blocks)
        for w in range(WARPS):
            seq = [(b + k * blocks) * gh + w for k in range(n_q)]
            seq += [o0 + otile * gh + w] if otile < tiles_h else []
            seq += [gu0 + ((j & 1) * units + b + (j >> 1) * blocks) * gh + w for j in range(2 * n_a)]
            seq += [dn0 + otile * gi + w + q * WARPS for q in range(-(-(gi - w) // WARPS))] if otile < tiles_h else []
            seqs[b, w] = seq
    return step_index(seqs, blocks)


def layer_records(m: "Layers", blocks: int) -> tuple[int, torch.Tensor]:
    steps, index = layer_record_sources(blocks)
    s = m.stacked
    mats = [[(s[k][ell], s[k + "_s"][ell]) for k in ("qkv", "o", "gu", "dn")] for ell in range(m.n)]
    return steps, stored_records(mats, index)


def reference(m: Layers, layers: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """h after `layers` layers in the unfused PyTorch rounding, the caches it wrote, and the last
    layer's qkv, attention output and MLP activation (to tell which phase parted, if one did)."""
    h, k, v = m.h0.clone(), m.k0.clone(), m.v0.clone()
    pos = torch.tensor([m.pos], dtype=torch.int32, device=DEV)
    slot = torch.zeros(1, dtype=torch.int32, device=DEV)
    for ell in range(layers):
        (qq, qs), (oq, os_), (gq, gs), (dq, ds) = m.ckpt[ell]
        qkv = gemv_w4_ref(rms_norm_chunked_ref(h, m.ln1[ell], EPS), qq, qs, bias=m.bias[ell])
        q = rope_kv_write_ref(qkv, m.cos, m.sin, pos, slot, k[ell], v[ell], num_q_heads=HQ, num_kv_heads=HKV)
        attn = decode_attention_ref(q, k[ell], v[ell], pos + 1, slot)  # [1, Hq, D]
        h = gemv_w4_ref(attn.reshape(1, HQ * D), oq, os_, residual=h)
        a = gate_up_silu_w4_ref(rms_norm_chunked_ref(h, m.ln2[ell], EPS), gq, gs)
        h = gemv_w4_ref(a, dq, ds, residual=h)
    return h, k, v, {"qkv": qkv, "attn": attn, "a": a}


class Buffers:
    """The activations of one run, poisoned, and a fresh copy of the caches."""

    def __init__(self, m: Layers, splits: int):
        self.h = m.h0.clone()
        self.sums = norm_chunk_sums_ref(self.h).contiguous()
        nan = lambda *shape: torch.full(shape, float("nan"), dtype=torch.float16, device=DEV)  # noqa: E731
        self.qkv, self.attn, self.a = nan(1, NQKV), nan(1, HQ, D), nan(1, I)
        self.k, self.v = m.k0.clone(), m.v0.clone()
        self.part_o = torch.full((HQ, splits, D), float("nan"), device=DEV)
        self.part_ml = torch.full((HQ, splits, 2), float("nan"), device=DEV)
        self.counter = torch.zeros(1, dtype=torch.int32, device=DEV)


def product_chain(m: Layers, buf: Buffers, layers: int, splits: int):
    pos = torch.tensor([m.pos], dtype=torch.int32, device=DEV)
    lens, slot = pos + 1, torch.zeros(1, dtype=torch.int32, device=DEV)
    ws = DecodeAttentionWorkspace.allocate(1, HQ, D, splits, DEV)
    t = m.tiles

    def run(_i=0):
        for ell in range(layers):
            gemv_w4(buf.h, t["qkv"][ell], t["qkv_s"][ell], bias=m.bias[ell],
                    norm=FusedNorm(m.ln1[ell], buf.sums, EPS), out=buf.qkv)
            rope_decode_attention(buf.qkv, m.cos, m.sin, pos, lens, slot, buf.k[ell], buf.v[ell], num_q_heads=HQ,
                                  workspace=ws, out=buf.attn)
            gemv_w4(buf.attn.view(1, HQ * D), t["o"][ell], t["o_s"][ell], residual=buf.h, out=buf.h,
                    sums_out=buf.sums)
            gate_up_silu_w4(buf.h, t["gu"][ell], t["gu_s"][ell], norm=FusedNorm(m.ln2[ell], buf.sums, EPS), out=buf.a)
            gemv_w4(buf.a, t["dn"][ell], t["dn_s"][ell], residual=buf.h, out=buf.h, sums_out=buf.sums)
    return run


@functools.lru_cache(maxsize=None)
def compile_layer(ring: int):
    import cupy

    code = persistent_source(KERNEL_FILES)
    name = f"persistent_layer_kernel<{ring}>"
    return cupy.RawModule(code=code, options=loader.COMPILE_OPTIONS, name_expressions=(name,)).get_function(name)


def persistent_chain(kernel, ring: int, m: Layers, buf: Buffers, layers: int, splits: int, stamps=None,
                     records: tuple[int, torch.Tensor] | None = None):
    blocks = loader.sm_count(torch.device(DEV))
    chunk = max(16, -(-(m.pos + 1) // splits))
    used = -(-(m.pos + 1) // chunk)
    if not (H // 16 <= blocks and -(-(I // 16) // blocks) <= 8 and HKV * used <= blocks and HQ <= blocks
            and chunk <= 32 and HQ // HKV <= 8):
        raise SystemExit(f"the probe's kernel does not fit {blocks} SMs with chunk {chunk}, {used} splits used")
    shared = WARPS * ring * SLOT_BYTES + EXTRA_SHARED + I * 2
    if loader.resident_blocks(kernel, 32 * WARPS, shared) < 1:
        raise SystemExit(f"ring {ring}: {shared} B of shared memory do not fit a block on this GPU")
    s = m.stacked
    steps, first = (0, s["qkv"]) if records is None else records
    args = (first.data_ptr(), s["qkv_s"].data_ptr(), m.bias.data_ptr(), s["o"].data_ptr(), s["o_s"].data_ptr(),
            s["gu"].data_ptr(), s["gu_s"].data_ptr(), s["dn"].data_ptr(), s["dn_s"].data_ptr(),
            m.ln1.data_ptr(), m.ln2.data_ptr(), buf.h.data_ptr(), buf.sums.data_ptr(), buf.qkv.data_ptr(),
            buf.attn.data_ptr(), buf.a.data_ptr(), buf.k.data_ptr(), buf.v.data_ptr(),
            m.cos.data_ptr(), m.sin.data_ptr(), np.int32(m.cos.stride(0)), buf.part_o.data_ptr(),
            buf.part_ml.data_ptr(), buf.counter.data_ptr(), np.int32(layers), np.int32(H), np.int32(I),
            np.int32(HQ), np.int32(HKV), np.int32(m.max_len), np.int32(m.pos), np.int32(splits), np.int32(chunk),
            np.float32(EPS), np.float32(1 / math.sqrt(D)), 0 if stamps is None else stamps.data_ptr(), np.int32(steps))

    def run(_i=0):
        buf.counter.zero_()
        loader.launch(kernel, (blocks,), (32 * WARPS,), args, shared_mem=shared)
    return run


def check(m: Layers, variants: dict, layers: int, splits: int) -> dict:
    ref_h, ref_k, ref_v, ref_last = reference(m, layers)
    at = (slice(0, layers), 0, slice(None), m.pos)  # the k / v rows written at pos

    def errors(buf: Buffers) -> dict:  # relative errors against the reference
        last = {key: rel_err(getattr(buf, key), ref) for key, ref in ref_last.items()}
        return {"h": rel_err(buf.h, ref_h), "k": rel_err(buf.k[at], ref_k[at]), "v": rel_err(buf.v[at], ref_v[at]),
                **{f"last layer's {key}": e for key, e in last.items()}}

    out = {"layers": layers, "ref_absmax": float(ref_h.float().abs().max())}
    buf = Buffers(m, splits)
    product_chain(m, buf, layers, splits)()
    torch.cuda.synchronize()
    out["product rel_err"] = product = errors(buf)
    for name, (ring, kernel, records) in variants.items():
        runs = []
        for _ in range(2):
            buf = Buffers(m, splits)
            persistent_chain(kernel, ring, m, buf, layers, splits, records=records)()
            torch.cuda.synchronize()
            runs.append(buf)
        found = errors(runs[0])
        keys = ("h", "k", "v", "sums", "qkv", "attn", "a")
        found["poisoned outputs left"] = [key for key in ("qkv", "attn", "a") if torch.isnan(getattr(runs[0], key)).any()]
        found["repeat bit-equal"] = all(torch.equal(getattr(runs[0], key), getattr(runs[1], key)) for key in keys)
        found["sums are h's"] = bool(torch.equal(runs[0].sums, norm_chunk_sums_ref(runs[0].h)))
        out[f"{name}: rel_err"] = found
        within = all(found[key] < 4 * max(product[key], 1e-3) for key in product)
        if not (within and found["repeat bit-equal"] and found["sums are h's"]) or found["poisoned outputs left"]:
            raise SystemExit(f"{name} parts from the reference:\n" + json.dumps(out, indent=1))
    return out


def stamp_summary(stamps: torch.Tensor) -> dict:
    """Per phase: the slowest block's time from its wait's end to its arrival, and the barrier
    before it (the blocks' median wait end - the last arrival of the phase before); medians over
    the layers, µs; and the layer period."""
    t = stamps.double().cpu() / 1e3  # [L, 12, G]
    out = {}
    for p, name in enumerate(STAMPS):
        out[f"{name}: waited -> arrived, slowest block"] = float((t[:, 2 * p + 1] - t[:, 2 * p]).max(dim=1).values.median())
        if p:
            last_prev = t[:, 2 * p - 1].max(dim=1).values
            out[f"barrier before {name}"] = float((t[:, 2 * p].median(dim=1).values - last_prev).median())
    last = t[:, 11].max(dim=1).values
    out["layer period"] = float((last[1:] - last[:-1]).median())
    return out


def timing(m: Layers, variants: dict, layers: int, splits: int, copy_gbps: float) -> list[dict]:
    buf = Buffers(m, splits)
    sides = {"product chain (graphed)": product_chain(m, buf, layers, splits)}
    sides.update({n: persistent_chain(k, r, m, buf, layers, splits, records=rec) for n, (r, k, rec) in variants.items()})
    rows = [{"side": n, "us_per_layer": time_us(fn, graph=True, launches=2, trials=15) / layers}
            for n, fn in sides.items()]
    layer_bytes = sum(t.numel() * t.element_size() for t in m.stacked.values()) / m.n
    for r in rows:
        r["speedup_vs_product"] = rows[0]["us_per_layer"] / r["us_per_layer"]
        r["copy_fraction"] = layer_bytes / r["us_per_layer"] / 1e3 / copy_gbps
        print(f"{r['side']:36} {r['us_per_layer']:7.2f} µs/layer  {100 * r['copy_fraction']:5.1f} % of copy"
              f"  {r['speedup_vs_product']:5.2f}x")
    return rows


def stamped(m: Layers, variants: dict, layers: int, splits: int) -> dict:
    out = {}
    for name, (ring, kernel, records) in variants.items():
        st = torch.zeros(layers, 2 * len(STAMPS), loader.sm_count(torch.device(DEV)), dtype=torch.int64, device=DEV)
        persistent_chain(kernel, ring, m, Buffers(m, splits), layers, splits, st, records=records)()
        torch.cuda.synchronize()
        out[name] = stamp_summary(st)
    print("stamps, µs: " + " | ".join(out))
    for k in next(iter(out.values())):
        print(f"  {k:48} " + " ".join(f"{s[k]:7.2f}" for s in out.values()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--check-layers", type=int, default=3)
    ap.add_argument("--pos", type=int, default=511, help="the new token's position (context pos + 1)")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--variants", default="6,10,10r", help="ring depths; a trailing r: pieces stored as records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    blocks = loader.sm_count(torch.device(DEV))
    splits = default_num_splits(HKV, args.max_len, blocks)
    m = Layers(args.layers, args.max_len, args.pos, args.seed)
    records = layer_records(m, blocks) if "r" in args.variants else None
    variants = {}
    for v in args.variants.split(","):
        ring = int(v.rstrip("r"))
        name = f"persistent, ring {ring}" + (", records" if v.endswith("r") else "")
        variants[name] = (ring, compile_layer(ring), records if v.endswith("r") else None)
    checked = check(m, variants, args.check_layers, splits)
    print(json.dumps(checked, indent=1))
    copy_gbps = copy_bandwidth_gbps()
    print(f"copy {copy_gbps:.0f} GB/s; {args.layers} layers of the 3B w4, batch 1, position {args.pos}, {splits} splits")
    rows = timing(m, variants, args.layers, splits, copy_gbps)
    stamps = stamped(m, variants, args.layers, splits)
    result = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit,
              "torch": torch.__version__, "copy_gb_per_s": copy_gbps, "layers": args.layers, "pos": args.pos,
              "splits": splits, "check": checked, "rows": rows, "stamps_us": stamps}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
