#!/usr/bin/env python3
"""The device draw kernels (temperature_draw.cu) against the PyTorch draw they replace.

A sampled row used to be drawn after the graph replay by app.engine.sampling.sample_rows on the
device, one row at a time: a softmax, a cumulative sum and a search over Qwen's 152k logits at
a temperature alone (the tray's default, 0.3: 4-6 % of a greedy step), plus a sort with top-k /
top-p (12-16 %; docs/history/kernels/phase-15.md). The peer in the same run is exactly that
path (``TorchDraw`` below, swapped into the runner).

1. The draw alone: µs per call for 1 / 4 / 8 / 16 rows of Qwen's vocabulary, at temperature
   0.3 and at 0.7 with top-p 0.9 and top-k 50; the GPU's time (calls captured in a CUDA graph)
   and eager (launch overhead included), CUDA events.
2. The decode: synthetic Qwen2.5-3B `w4` / 7B `mixed` (bench_device_sampling's setup, a
   512-token prompt, 128 tokens), batch 1 and 4, greedy (the ceiling) and both kinds drawn by
   the kernels and by the peer; median of 3 alternating rounds.

    python -m benchmarks.bench_temperature_draw --commit SHA [--out docs/results/temperature_draw_<gpu>.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import statistics
from pathlib import Path

import torch

from app.engine import Engine
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.engine.sampling import sample_rows
from app.formats.recipe import BUILTIN_RECIPES
from app.kernels import draw_workspace, filtered_draw, temperature_draw
from benchmarks.common import (
    DEV, fresh, prompt_ids, qwen_tokenizer, require_gpu, result_path, run_requests, spec_of,
)

VOCAB, LD = 151_665, 151_936  # Qwen2.5's tokenizer and its padded lm_head
ROUNDS = 3


class TorchDraw:
    """The peer: the PyTorch draw of phase 15 (sample_rows, one row at a time; top-k / top-p sort the row)."""

    def temperature_draw(self, logits, vocab, params, *, workspace, out):
        return self._rows(logits, vocab, params, out, filtered=False)

    def filtered_draw(self, logits, vocab, params, *, workspace, out):
        return self._rows(logits, vocab, params, out, filtered=True)

    @staticmethod
    def _rows(logits, vocab, params, out, filtered: bool):
        temperature, top_p, top_k, u = params
        for i in range(logits.shape[0]):
            at = slice(i, i + 1)
            sample_rows(logits[at, :vocab], temperature[at], top_p[at], top_k[at].long(), u[at], out[at],
                        filtered=filtered)
        return out


def time_us(fn, calls: int = 200) -> float:
    """Eager: µs per call, launch overhead included (what the runner pays after a replay)."""
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def graph_us(fn, calls: int = 20, replays: int = 20) -> float:
    """The GPU's own time: ``calls`` calls captured in one CUDA graph, µs per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * replays)


DRAW_KINDS = {"T=0.3": (0.3, 1.0, 0.0), "T=0.7 top-p 0.9 top-k 50": (0.7, 0.9, 50.0)}


def draw_alone() -> list[dict]:
    rows_out = []
    for kind, (t, p, k) in DRAW_KINDS.items():
        filtered = p < 1 or k > 0
        for rows in (1, 4, 8, 16):
            logits = (torch.randn(rows, LD, device=DEV) * 3).half()
            params = torch.tensor([[t] * rows, [p] * rows, [k] * rows, [0.37] * rows], device=DEV)
            out = torch.zeros(rows, dtype=torch.int64, device=DEV)
            workspace = draw_workspace(rows, DEV)
            ours = filtered_draw if filtered else temperature_draw
            peer = TorchDraw().filtered_draw if filtered else TorchDraw().temperature_draw

            def kernel():
                ours(logits, VOCAB, params, workspace=workspace, out=out)

            def torch_draw():
                peer(logits, VOCAB, params, workspace=None, out=out)

            row = dict(kind=kind, rows=rows, kernel_us=graph_us(kernel), torch_us=graph_us(torch_draw),
                       kernel_eager_us=time_us(kernel), torch_eager_us=time_us(torch_draw))
            row["speedup"] = row["torch_us"] / row["kernel_us"]
            rows_out.append(row)
            print(f"draw alone, {kind:24s} {rows:2d} rows, graphed: kernel {row['kernel_us']:7.1f} µs  "
                  f"PyTorch {row['torch_us']:7.1f} µs  {row['speedup']:5.1f}x;  "
                  f"eager: {row['kernel_eager_us']:7.1f} / {row['torch_eager_us']:7.1f} µs", flush=True)
    return rows_out


def decode_rows(model: str, recipe: str) -> list[dict]:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=4, max_context=1024, device=DEV)
    del weights
    tokenizer = qwen_tokenizer()
    engine = Engine.from_runner(runner, spec, tokenizer, model_id=f"{model}-{recipe}", lookup_draft=0)
    kernel_ops = runner.draw._ops
    label = f"{model} {recipe} (synthetic)"
    out = []
    try:
        prompts = [prompt_ids(512, i, min(tokenizer.vocab_size, spec.vocab_size)) for i in range(4)]
        for batch in (1, 4):
            batch_prompts = prompts[:batch]
            run_requests(engine, batch_prompts, dict(temperature=0))  # warm
            for kind, (t, p, k) in DRAW_KINDS.items():
                mode = dict(temperature=t, top_p=p, top_k=int(k))
                rates = {"greedy": [], "kernel": [], "torch": []}
                for i in range(ROUNDS):
                    order = ("kernel", "torch") if i % 2 == 0 else ("torch", "kernel")
                    rates["greedy"].append(run_requests(engine, batch_prompts, dict(temperature=0))[0])
                    for who in order:
                        runner.draw._ops = kernel_ops if who == "kernel" else TorchDraw()
                        rates[who].append(run_requests(engine, batch_prompts, mode)[0])
                runner.draw._ops = kernel_ops
                row = dict(model=label, batch=batch, kind=kind, rounds=rates,
                           **{f"{w}_tokens_per_s": statistics.median(v) for w, v in rates.items()})
                row["speedup"] = row["kernel_tokens_per_s"] / row["torch_tokens_per_s"]
                row["kernel_vs_greedy"] = row["kernel_tokens_per_s"] / row["greedy_tokens_per_s"]
                out.append(row)
                print(f"{label:22s} batch {batch} {kind:24s}: greedy {row['greedy_tokens_per_s']:7.1f}  kernel "
                      f"{row['kernel_tokens_per_s']:7.1f}  PyTorch {row['torch_tokens_per_s']:7.1f} tok/s  "
                      f"{row['speedup']:4.2f}x (kernel / greedy {row['kernel_vs_greedy']:.3f})", flush=True)
    finally:
        engine.close()
        del engine, runner
        gc.collect()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", default="3B,7B")
    args = ap.parse_args()
    require_gpu()
    props = torch.cuda.get_device_properties(0)
    result = dict(gpu=props.name, date=dt.date.today().isoformat(), commit=args.commit, torch=torch.__version__,
                  vocab=VOCAB, ld=LD, draw_alone=draw_alone(), decode=[])
    for model, recipe in (("3B", "w4"), ("7B", "mixed")):
        if model in args.models.split(","):
            result["decode"] += decode_rows(model, recipe)
    out = Path(args.out or result_path("temperature_draw", props.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
