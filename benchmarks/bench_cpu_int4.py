#!/usr/bin/env python3
"""A decode step's linear layers on the CPU: the int4 backend against the dense ones, same run.

Where a model runs on the CPU (no NVIDIA GPU, the kernels unavailable, or Settings' "the CPU
only"), a quantized checkpoint in bfloat16 computes with app.quant.cpu_int4 (PyTorch's CPU int4
kernel over the 4-bit codes) instead of the dense backend's dequantized bfloat16 weights. This
times one decoder layer's linears (qkv, o, gate/up, down) and the head of Qwen2.5-3B and -7B at
batch 1 with random W4 weights, scales it to the whole model (every layer has the same shapes),
and prints the dense bfloat16 and float32 peers beside it with the ratio (each step time over
int4's). Weight bytes read per
token are printed too: the CPU's memory bandwidth bounds all three.

    python3 benchmarks/bench_cpu_int4.py --commit SHA [--out docs/results/cpu_int4_<cpu>.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.quant import cpu_int4  # noqa: E402
from app.quant.modules import QuantLinear  # noqa: E402
from app.quant.tensor import quantize  # noqa: E402

# hidden, q + 2 kv rows of the fused qkv, intermediate, vocab, layers
MODELS = {"Qwen2.5-3B": (2048, 2048 + 2 * 256, 11008, 151936, 36),
          "Qwen2.5-7B": (3584, 3584 + 2 * 512, 18944, 152064, 28)}


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    hidden, qkv, inter, vocab, _ = MODELS[model]
    return {"qkv": (qkv, hidden), "o": (hidden, hidden), "gate_up": (2 * inter, hidden), "down": (hidden, inter),
            "head": (vocab, hidden)}


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def time_linear(n: int, k: int, repeats: int) -> dict:
    """One [n, k] W4 linear at batch 1: int4 (bf16 x), dense bf16, dense fp32; ms each."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn((n, k), generator=gen) * 0.02
    module = QuantLinear(quantize(w, 4, name="bench", method="rtn"), k)
    dense16, dense32 = module.dequantize(torch.bfloat16).contiguous(), module.dequantize(torch.float32).contiguous()
    cpu_int4.use_int4_backend(module, torch.bfloat16)  # (drops the checkpoint tensors: dequantize before)
    del w
    x = torch.randn((1, k), generator=gen)
    x16 = x.bfloat16()
    return dict(int4_ms=median_ms(lambda: module(x16), repeats),
                bf16_ms=median_ms(lambda: F.linear(x16, dense16), repeats),
                fp32_ms=median_ms(lambda: F.linear(x, dense32), repeats),
                int4_bytes=n * k // 2 + n * (k // 128) * 2, bf16_bytes=2 * n * k, fp32_bytes=4 * n * k)


def bench_model(model: str, repeats: int) -> dict:
    layers = MODELS[model][4]
    parts = {name: time_linear(n, k, repeats) for name, (n, k) in layer_shapes(model).items()}
    step = {}
    for kind in ("int4", "bf16", "fp32"):
        per_layer = sum(p[f"{kind}_ms"] for name, p in parts.items() if name != "head")
        layer_bytes = sum(p[f"{kind}_bytes"] for name, p in parts.items() if name != "head")
        ms = layers * per_layer + parts["head"][f"{kind}_ms"]
        nbytes = layers * layer_bytes + parts["head"][f"{kind}_bytes"]
        step[kind] = dict(ms=ms, tokens_per_s=1e3 / ms, gb_per_token=nbytes / 1e9, gbps=nbytes / ms / 1e6)
    return dict(model=model, layers=layers, parts=parts, step=step)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not cpu_int4.available():
        sys.exit("this PyTorch has no working CPU int4 kernel: nothing to measure")
    result = dict(cpu=cpu_name(), threads=torch.get_num_threads(), date=dt.date.today().isoformat(),
                  commit=args.commit, torch=torch.__version__, models=[])
    print(f"{result['cpu']}, {result['threads']} threads, torch {result['torch']}, commit {args.commit}")
    print(f"{'model':<12}{'backend':>8}{'step ms':>10}{'tok/s':>8}{'GB/token':>10}{'GB/s':>7}{'vs int4':>9}")
    for model in MODELS:
        m = bench_model(model, args.repeats)
        result["models"].append(m)
        base = m["step"]["int4"]["ms"]
        for kind, s in m["step"].items():
            print(f"{model:<12}{kind:>8}{s['ms']:>10.1f}{s['tokens_per_s']:>8.2f}{s['gb_per_token']:>10.2f}"
                  f"{s['gbps']:>7.1f}{s['ms'] / base:>8.2f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
