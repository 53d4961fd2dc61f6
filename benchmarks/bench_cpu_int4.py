#!/usr/bin/env python3
"""A decode step's linear layers on the CPU: the int4 backend against the dense ones, same run.

Where a model runs on the CPU (no NVIDIA GPU, the kernels unavailable, or Settings' "the CPU
only"), a quantized checkpoint in bfloat16 computes with app.engine.quantized.cpu_int4 (PyTorch's CPU int4
kernel over the 4-bit codes) instead of the dense backend's dequantized bfloat16 weights. This
times one decoder layer's linears (qkv, o, gate/up, down) and the head of Qwen2.5-3B and -7B
with random W4 weights, at batch 1 (a decode step) and for a 256-token prefill chunk, scales
it to the whole model (every layer has the same shapes), and prints the dense bfloat16 and
float32 peers beside it with the ratio (each time over int4's). Dense bfloat16 depends on the
CPU: AMX (server Xeons) multiplies it fast, AVX2 (most laptops) converts it to float32 first;
the second command below limits this CPU to AVX2. Weight bytes read per
token are printed too: the CPU's memory bandwidth bounds all three.

    python -m benchmarks.bench_cpu_int4 --commit SHA [--out docs/results/cpu_int4_<cpu>.json]
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python -m benchmarks.bench_cpu_int4 ...  # a laptop's ISA
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

from app.engine.quantized import cpu_int4
from app.engine.quantized.modules import QuantLinear, use_int4_backend
from app.quant.search import quantize

# hidden, q + 2 kv rows of the fused qkv, intermediate, vocab, layers
MODELS = {"Qwen2.5-3B": (2048, 2048 + 2 * 256, 11008, 151936, 36),
          "Qwen2.5-7B": (3584, 3584 + 2 * 512, 18944, 152064, 28)}
PREFILL_ROWS = 256  # tokens of a prefill chunk timed


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


def time_linear(n: int, k: int, rows: tuple[int, ...], repeats: int) -> dict:
    """One [n, k] W4 linear: for each row count M, int4 (bf16 x), dense bf16 and dense fp32 in ms."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn((n, k), generator=gen) * 0.02
    module = QuantLinear(quantize(w, 4, name="bench", method="rtn"), k)
    dense16, dense32 = module.dequantize(torch.bfloat16).contiguous(), module.dequantize(torch.float32).contiguous()
    use_int4_backend(module, torch.bfloat16)  # (drops the checkpoint tensors: dequantize before)
    del w
    out = dict(int4_bytes=n * k // 2 + n * (k // 128) * 4, bf16_bytes=2 * n * k, fp32_bytes=4 * n * k)
    for m in rows:
        x = torch.randn((m, k), generator=gen)
        x16 = x.bfloat16()
        times = repeats if m == 1 else max(2, repeats // 5)
        out[m] = dict(int4_ms=median_ms(lambda: module(x16), times),
                      bf16_ms=median_ms(lambda: F.linear(x16, dense16), times),
                      fp32_ms=median_ms(lambda: F.linear(x, dense32), times))
    return out


def bench_model(model: str, repeats: int) -> dict:
    """The decode step (batch 1: every layer and the head) and a prefill chunk (PREFILL_ROWS
    tokens through every layer; the head runs for the last token only), per backend."""
    layers = MODELS[model][4]
    shapes = layer_shapes(model)
    parts = {name: time_linear(n, k, (1,) if name == "head" else (1, PREFILL_ROWS), repeats)
             for name, (n, k) in shapes.items()}
    decode, prefill = {}, {}
    for kind in ("int4", "bf16", "fp32"):
        layer_ms = sum(p[1][f"{kind}_ms"] for name, p in parts.items() if name != "head")
        layer_bytes = sum(p[f"{kind}_bytes"] for name, p in parts.items() if name != "head")
        ms = layers * layer_ms + parts["head"][1][f"{kind}_ms"]
        nbytes = layers * layer_bytes + parts["head"][f"{kind}_bytes"]
        decode[kind] = dict(ms=ms, tokens_per_s=1e3 / ms, gb_per_token=nbytes / 1e9, gbps=nbytes / ms / 1e6)
        chunk_ms = layers * sum(p[PREFILL_ROWS][f"{kind}_ms"] for name, p in parts.items() if name != "head")
        prefill[kind] = dict(ms=chunk_ms, tokens_per_s=PREFILL_ROWS * 1e3 / chunk_ms)
    return dict(model=model, layers=layers, parts=parts, decode=decode, prefill=prefill)


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
    result = dict(cpu=cpu_name(), isa=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
                  date=dt.date.today().isoformat(), commit=args.commit, torch=torch.__version__, models=[])
    print(f"{result['cpu']} ({result['isa']}), {result['threads']} threads, torch {result['torch']}, commit {args.commit}")
    print(f"{'model':<12}{'backend':>8}{'decode ms':>11}{'tok/s':>8}{'GB/token':>10}{'GB/s':>7}{'vs int4':>9}"
          f"{'prefill tok/s':>15}{'vs int4':>9}")
    for model in MODELS:
        m = bench_model(model, args.repeats)
        result["models"].append(m)
        d0, p0 = m["decode"]["int4"]["ms"], m["prefill"]["int4"]["ms"]
        for kind, d in m["decode"].items():
            p = m["prefill"][kind]
            print(f"{model:<12}{kind:>8}{d['ms']:>11.1f}{d['tokens_per_s']:>8.2f}{d['gb_per_token']:>10.2f}"
                  f"{d['gbps']:>7.1f}{d['ms'] / d0:>8.2f}x{p['tokens_per_s']:>15.1f}{p['ms'] / p0:>8.2f}x")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
