#!/usr/bin/env python3
"""Decode attention at short and long contexts vs the split length and count (H200 sweep).

Each (model shape, context, batch) is timed, graphed, for every ``min_chunk`` (minimum
positions per split: fewer, longer splits mean less partial data for the combine but a
longer chain of key steps per block) and every ``--split-factors`` multiple of the default
number of splits (more splits: more blocks per SM to hide latency at long contexts, more
partials to combine). Prints each row's ratio to the defaults and writes JSON.

    python -m benchmarks.bench_attention [--chunks 16] [--split-factors 1,2,4] [--commit SHA] \
        [--out docs/results/attention_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import torch

from app.kernels import DecodeAttentionWorkspace, decode_attention, default_num_splits
from app.kernels.attention import MAX_SPLITS, MIN_CHUNK
from benchmarks.common import KERNEL_SHAPES, require_gpu, time_us

DEV = "cuda"
CHUNKS = (4, 8, 16, 32, 64, 128)
CONTEXTS = (128, 520, 1024, 4096, 32768)


def sweep(sms: int, chunks: tuple[int, ...], batches: tuple[int, ...], factors: tuple[int, ...]) -> list[dict]:
    rows = []
    for model, c in KERNEL_SHAPES.items():
        hq, hkv, d = c["hq"], c["hkv"], c["d"]
        max_ctx = max(CONTEXTS)
        for batch in batches:
            kc = torch.randn(batch, hkv, max_ctx, d, device=DEV).half()
            vc = torch.randn_like(kc)
            q = torch.randn(batch, hq, d, device=DEV).half()
            slots = torch.arange(batch, dtype=torch.int32, device=DEV)
            default = default_num_splits(hkv, max_ctx, sms)
            spaces = {f: DecodeAttentionWorkspace.allocate(batch, hq, d, min(MAX_SPLITS, f * default), DEV)
                      for f in factors}
            for ctx in CONTEXTS:
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
                base = None
                for f, ws in spaces.items():
                    for chunk in chunks:
                        us = time_us(lambda i: decode_attention(q, kc, vc, lens, slots, workspace=ws,
                                                                min_chunk=chunk), graph=True)
                        base = us if (chunk, f) == (MIN_CHUNK, 1) else base
                        rows.append(dict(model=model, batch=batch, ctx=ctx, min_chunk=chunk, split_factor=f,
                                         splits=ws.num_splits, us_graph=us))
                for r in rows[-len(chunks) * len(factors):]:
                    r["vs_default"] = base / r["us_graph"]
            del kc, vc
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/attention_h200.json")
    ap.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="min_chunk values (must include the default)")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--split-factors", default="1", help="multiples of the default split count (must include 1)")
    args = ap.parse_args()
    require_gpu()
    props = torch.cuda.get_device_properties(0)
    chunks = tuple(int(c) for c in args.chunks.split(","))
    if MIN_CHUNK not in chunks:
        ap.error(f"--chunks must include the default {MIN_CHUNK} (the ratios are against it)")
    factors = tuple(int(f) for f in args.split_factors.split(","))
    if 1 not in factors:
        ap.error("--split-factors must include 1 (the ratios are against the default)")
    rows = sweep(props.multi_processor_count, chunks, tuple(int(b) for b in args.batches.split(",")), factors)
    result = dict(gpu=props.name, sm_count=props.multi_processor_count, date=dt.datetime.now(dt.timezone.utc).isoformat(),
                  git_commit=args.commit, torch=torch.__version__, default_min_chunk=MIN_CHUNK, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{props.name}: decode attention, us (graphed), x = speed vs min_chunk {MIN_CHUNK} and the default splits")
    for r in rows:
        print(f"{r['model']:9} B={r['batch']} ctx={r['ctx']:>6} min_chunk={r['min_chunk']:>3} "
              f"splits={r['splits']:>3} {r['us_graph']:7.2f} us  {r['vs_default']:.2f}x")


if __name__ == "__main__":
    main()
