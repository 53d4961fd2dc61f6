#!/usr/bin/env python3
"""Host time of drawing one sampled token (app.engine.sampling), per vocabulary size.

A sampled request (the tray's actions sample at temperature 0.3) draws every token on the
CPU from the logits row. ``RequestSampler.sample`` draws through the cumulative sum of the
probabilities (one uniform number); the peer in the same run is ``torch.multinomial`` on the
same probabilities, which the sampler used before. Printed side by side with the ratio:
the whole ``sample`` call (fp16 logits in, token out), and the draw alone.

    python -m lab.bench_sampling --commit SHA [--out docs/results/sampling_cpu.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import time
from pathlib import Path

import torch

from app.engine import SamplingParams
from app.engine.sampling import RequestSampler

VOCABS = {"SmolLM2": 49152, "Qwen2.5": 151936}
CALLS = 200


def per_call_ms(fn) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return (time.perf_counter() - started) / CALLS * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/sampling_cpu.json")
    args = ap.parse_args()
    rows = []
    for name, vocab in VOCABS.items():
        sampler = RequestSampler(SamplingParams(temperature=0.3, seed=1), list(range(64)), vocab)
        logits = (torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 3).half()
        probs = sampler._probabilities(sampler._penalized(logits))
        generator = torch.Generator().manual_seed(2)
        row = dict(vocab=name, size=vocab,
                   sample_ms=per_call_ms(lambda: sampler.sample(logits, 100)),
                   draw_ms=per_call_ms(lambda: sampler._draw(probs, 0.5)),
                   multinomial_ms=per_call_ms(lambda: torch.multinomial(probs, 1, generator=generator)))
        row["sample_with_multinomial_ms"] = row["sample_ms"] - row["draw_ms"] + row["multinomial_ms"]
        row["speedup"] = row["sample_with_multinomial_ms"] / row["sample_ms"]
        rows.append(row)
        print(f"{name:8s} {vocab:7d} tokens: sample {row['sample_ms']:.3f} ms (draw {row['draw_ms']:.3f}) | "
              f"with torch.multinomial {row['sample_with_multinomial_ms']:.3f} ms "
              f"(multinomial {row['multinomial_ms']:.3f}) | {row['speedup']:.1f}x", flush=True)
    result = dict(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
                  date=dt.date.today().isoformat(), commit=args.commit, torch=torch.__version__, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
