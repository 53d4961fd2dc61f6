#!/usr/bin/env python3
"""Decode attention at short and long contexts: the ways of cutting the work, side by side.

Each (model shape, context, batch) is timed, graphed (20 launches back to back), for every
named :class:`AttentionConfig` in ``CONFIGS`` (heads per block, warps, one pass or split +
combine, minimum positions per split), each with its own default number of splits. Prints
each row's speed relative to the two-pass kernel of phases 1-10 and writes JSON. What a
config costs inside the decode step (its dependent launches included) is ablate_step's
``two_pass_attention`` variant; this is the kernel alone.

    python3 benchmarks/bench_attention.py [--configs single,two_pass] [--commit SHA] \
        [--out docs/results/attention_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from app.kernels import DecodeAttentionWorkspace, decode_attention, default_num_splits  # noqa: E402
from app.kernels.attention import SINGLE_PASS_CONFIG, TWO_PASS_CONFIG, AttentionConfig  # noqa: E402
from bench_kernels import MODELS, time_us  # noqa: E402

DEV = "cuda"
CONTEXTS = (128, 520, 1024, 2048, 4096, 32768)
BASELINE = "two_pass"


def _single(heads: int, warps: int, min_chunk: int) -> AttentionConfig:
    return AttentionConfig(heads_per_block=heads, warps=warps, single_pass=True, min_chunk=min_chunk)


CONFIGS = {
    BASELINE: TWO_PASS_CONFIG, "single": SINGLE_PASS_CONFIG,
    "single_2x8_c16": _single(2, 8, 16), "single_2x8_c64": _single(2, 8, 64),
    "single_1x8": _single(1, 8, 32), "single_2x4": _single(2, 4, 16), "single_4x4": _single(4, 4, 16),
    "single_4x8": _single(4, 8, 32), "single_2x16": _single(2, 16, 64), "single_8x4": _single(8, 4, 16),
}


def sweep(sms: int, configs: dict[str, AttentionConfig], batches: tuple[int, ...]) -> list[dict]:
    rows = []
    for model, c in MODELS.items():
        hq, hkv, d = c["hq"], c["hkv"], c["d"]
        max_ctx = max(CONTEXTS)
        for batch in batches:
            kc = torch.randn(batch, hkv, max_ctx, d, device=DEV).half()
            vc = torch.randn_like(kc)
            q = torch.randn(batch, hq, d, device=DEV).half()
            slots = torch.arange(batch, dtype=torch.int32, device=DEV)
            spaces = {name: DecodeAttentionWorkspace.allocate(batch, hq, d, default_num_splits(hq, hkv, max_ctx, sms,
                                                                                                   cfg), DEV)
                      for name, cfg in configs.items()}
            for ctx in CONTEXTS:
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
                timed = {}
                for name, cfg in configs.items():
                    ws = spaces[name]
                    timed[name] = time_us(lambda i: decode_attention(q, kc, vc, lens, slots, workspace=ws, config=cfg),
                                          graph=True)
                base = timed.get(BASELINE)
                for name, us in timed.items():
                    rows.append(dict(model=model, batch=batch, ctx=ctx, config=name, splits=spaces[name].num_splits,
                                     us_graph=us, vs_two_pass=base / us if base else None))
            del kc, vc
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/attention_h200.json")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    ap.add_argument("--batches", default="1,4")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    configs = {name: CONFIGS[name] for name in args.configs.split(",")}
    rows = sweep(props.multi_processor_count, configs, tuple(int(b) for b in args.batches.split(",")))
    result = dict(gpu=props.name, sm_count=props.multi_processor_count, date=dt.datetime.now(dt.timezone.utc).isoformat(),
                  git_commit=args.commit, torch=torch.__version__,
                  configs={name: dict(heads_per_block=c.heads_per_block, warps=c.warps, single_pass=c.single_pass,
                                      min_chunk=c.min_chunk) for name, c in configs.items()}, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{props.name}: decode attention, us (graphed), x = speed vs the two-pass kernel")
    for r in rows:
        ratio = f"{r['vs_two_pass']:.2f}x" if r["vs_two_pass"] else ""
        print(f"{r['model']:9} B={r['batch']} ctx={r['ctx']:>6} {r['config']:>15} splits={r['splits']:>3} "
              f"{r['us_graph']:7.2f} us  {ratio}")


if __name__ == "__main__":
    main()
