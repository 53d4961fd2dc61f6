#!/usr/bin/env python3
"""Whole-model decode and prefill on the GPU (CudaRunner, CUDA graphs) vs peers, same run.

Synthetic weights with the exact shapes of Qwen2.5-3B (recipe ``w4``) and Qwen2.5-7B
(``mixed``, ``q4``), quantized layouts filled with random words (speed does not depend on
values). Per model:

- decode tokens/s at batch 1, 2, 4, 8: 128 greedy steps after 512-token prompts, host loop
  included (upload ids, replay, read back argmax ids); and the replayed graph alone (events);
- prefill tokens/s and time to first token for 512- and 2048-token prompts (GEMM prefill
  with its first chunk replayed from a CUDA graph, all eager, with the PyTorch dequantizer,
  and through the decode graph); short-prompt TTFT (64 and 512 tokens) graph vs eager;
- peak VRAM (allocator reserved), weight bytes per token, bandwidth as a fraction of the
  device-to-device copy measured in the same run;
- peers, graphed, linear layers of a decode step only (attention, norms excluded, which
  favours them): PyTorch bf16 (cuBLAS) and ``aten._weight_int4pack_mm`` (tinygemm, W4 g128);
  our linear layers alone on the same footing;
- budgeted runs: 7B mixed with a 4096-token cache and 3B w4 with 8192 inside --vram-budget
  3.2GiB (the allocator is capped there: exceeding it is an error), 7B q4 must be refused.

    python -m benchmarks.bench_decode [--quick] [--commit SHA] [--out docs/results/decode_h200.json]

On a 4 GB card (an RTX 3050 Laptop) only the budgeted runs fit: ``--budget-only`` runs them, each
in its own process, and this process then holds no GPU memory beside them (no copy measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

from app.engine.cuda.memory import GiB, MiB, VramBudgetError, parse_size
from app.engine.cuda.runner import runner_for_weights
from app.engine.cuda.synthetic import synthetic_weights
from app.formats.recipe import BUILTIN_RECIPES
from app.formats.spec import ModelSpec
from app.kernels import programmatic
from benchmarks.common import (
    DEV, LLAMA_CPP, RUNS, TARGETS, copy_bandwidth_gbps, decode_tokens_per_s, fresh, int4_peer_step, linears_only_us,
    peer_inputs, prefill_time, prompt_ids, require_gpu, result_path, spec_of, time_us,
)

# (model, recipe, context, budget, prefill mode[, slots asked of a fitted load]). The fourth: the
# 16-row graph prefill with ~4 MB of headroom on the H200, where top-k / top-p draws share the
# prefill's segment margin. The last: the tray's load (4 requests, fitted to the budget).
BUDGET_RUNS = [("7B", "mixed", 4096, "3.2GiB", "auto"), ("3B", "w4", 8192, "3.2GiB", "auto"),
               ("7B", "q4", 4096, "3.2GiB", "auto"), ("7B", "mixed", 4096, "3.21GiB", "graph"),
               ("7B", "mixed", 4096, "3.2GiB", "auto", 4)]


def short_prompt_ttft(runner, vocab: int) -> dict:
    """Median prefill time (to CPU logits) of a 64- and a 512-token prompt at position 0: the
    first chunk replayed from its bucket's CUDA graph vs the eager GEMM prefill."""
    out = {}
    graphs = runner.padded_prefill
    for n, repeats in ((64, 20), (512, 5)):
        row = {}
        for mode in ("graph", "eager") if graphs else ("eager",):
            runner.padded_prefill = mode == "graph"
            row[f"{mode}_s"] = prefill_time(runner, n, vocab, repeats=repeats)
        out[n] = row
    runner.padded_prefill = graphs
    return out


def bench_model(model: str, recipe: str, copy_gbps: float, quick: bool) -> dict:
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=1)
    fresh()
    runner = runner_for_weights(weights, num_slots=8, max_context=4096, device=DEV, label=f"Qwen2.5-{model}")
    w = runner.weights
    out = dict(model=f"Qwen2.5-{model}", recipe=recipe, weights_bytes=w.nbytes, bytes_per_token=w.bytes_per_token,
               plan=runner.plan.describe(), prefill_mode=runner.prefill_mode, decode={}, prefill={})
    for batch in (1, 2, 4, 8):
        tps, step_us, pipelined = decode_tokens_per_s(runner, batch, spec.vocab_size)
        out["decode"][batch] = dict(tokens_per_s=tps, graph_step_us=step_us, graph_tokens_per_s=batch * 1e6 / step_us,
                                    pipelined_tokens_per_s=pipelined)
    step1 = out["decode"][1]["graph_step_us"]
    out["bandwidth_gbps"] = w.bytes_per_token / step1 / 1e3
    out["frac_copy"] = out["bandwidth_gbps"] / copy_gbps
    for n in (512,) if quick else (512, 2048):
        seconds = prefill_time(runner, n, spec.vocab_size)
        out["prefill"][f"gemm_{n}"] = dict(ttft_s=seconds, tokens_per_s=n / seconds)
    out["ttft"] = short_prompt_ttft(runner, spec.vocab_size)
    out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    info = runner.memory_info()
    out["prefill_graphs"] = dict(buckets=info["prefill_graph_buckets"],
                                 reserved_bytes=info["prefill_graph_reserved_bytes"],
                                 planned_bytes=runner.plan.prefill_graph_bytes)
    out["linears_only_us"] = linears_only_us(runner)
    gemm = runner.gemm
    runner.padded_prefill = False  # below: eager variants (a graph has its dequantizer baked in)
    if gemm is not None and gemm.dequant_kernel is not None:
        gemm.dequant_kernel, kernel = None, gemm.dequant_kernel
        seconds = prefill_time(runner, 512, spec.vocab_size, repeats=1)
        out["prefill"]["gemm_torch_dequant_512"] = dict(ttft_s=seconds, tokens_per_s=512 / seconds)
        gemm.dequant_kernel = kernel
    runner.gemm, gemm = None, runner.gemm  # prefill through the decode graph, 8 tokens a replay
    seconds = prefill_time(runner, 512, spec.vocab_size, repeats=1)
    out["prefill"]["graph_512"] = dict(ttft_s=seconds, tokens_per_s=512 / seconds)
    runner.close()
    del runner, gemm, w
    fresh()
    out["peers"] = peer_stacks(spec, model, recipe, copy_gbps)
    return out


def peer_stacks(spec: ModelSpec, model: str, recipe: str, copy_gbps: float) -> dict:
    """bf16 cuBLAS and int4 tinygemm linear stacks (batch 1, graphed, distinct weights per layer)."""
    shapes, xs, xh = peer_inputs(spec)
    out = {}
    for name, stack in (("bf16_cublas", bf16_stack), ("int4_tinygemm", int4_stack)):
        try:
            out[name] = stack(spec, shapes, xs, xh, copy_gbps)
        except (RuntimeError, NotImplementedError) as e:
            out[name + "_error"] = str(e).splitlines()[0][:300]
        fresh()
    return out


def bf16_stack(spec, shapes, xs, xh, copy_gbps) -> dict:
    layers = [[torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for n, k in shapes]
              for _ in range(spec.num_layers)]
    head = torch.randn(spec.vocab_size, spec.hidden_size, device=DEV, dtype=torch.bfloat16)
    nbytes = 2 * (sum(n * k for n, k in shapes) * spec.num_layers + head.numel())

    def step(_i):
        for layer in layers:
            for x, wt in zip(xs, layer):
                F.linear(x, wt)
        F.linear(xh, head)

    us = time_us(step, graph=True, launches=1, trials=20)
    return dict(us=us, tokens_per_s=1e6 / us, frac_copy=nbytes / us / 1e3 / copy_gbps)


def int4_stack(spec, shapes, xs, xh, copy_gbps) -> dict:
    step, nbytes = int4_peer_step(spec, shapes, xs, xh)
    us = time_us(step, graph=True, launches=1, trials=20)
    return dict(us=us, tokens_per_s=1e6 / us, frac_copy=nbytes / us / 1e3 / copy_gbps)


def sampled_steps(runner, vocab: int, steps: int = 64) -> list[str]:
    """Sampled decode steps drawn on the device (temperature only; top-p / top-k where the plan
    has room for the sort), so the draw's temporaries count in the budget's peak."""
    from app.engine.sampling import RowSampling

    drawn = []
    for name, row in (("temperature", RowSampling(0.7, 1.0, 0, 1, vocab)),
                      ("top-p/top-k", RowSampling(0.7, 0.9, 50, 2, vocab))):
        if not runner.capabilities.draw_on_device:
            continue
        runner.set_sampling(0, row)
        token = runner.prefill(0, prompt_ids(16, 3, vocab), 0).argmax().item()
        for pos in range(16, 16 + steps):
            token = runner.decode_tokens([0], [token], [pos])[0]
        drawn.append(name)
    runner.set_sampling(0, None)
    return drawn


def in_fresh_process(fn, *args):
    """fn(*args) in a spawned process: its CUDA context and memory end with it."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def device_facts() -> dict:
    props = torch.cuda.get_device_properties(DEV)
    return dict(gpu=props.name, sms=props.multi_processor_count,
                programmatic_launch=programmatic.enabled(torch.cuda.get_device_capability(DEV)))


def bench_budget(model: str, recipe: str, context: int, budget: str, prefill_mode: str = "auto",
                 fitted_slots: int | None = None) -> dict:
    """One budget case in a fresh process: what a user's process holds, nothing left over from
    earlier measurements (cuBLAS workspaces, graph pools) counted against the budget.
    ``fitted_slots``: that many requests asked for, the load fitted to the budget (the tray's)."""
    return in_fresh_process(_budget_case, model, recipe, context, budget, prefill_mode, fitted_slots)


def memory_beside_allocator(free_at_start: int, reserved_at_start: int, when: str) -> dict:
    """What this process took from the device since the start, and how much of it lies outside
    PyTorch's allocator (CUDA graphs, kernel modules and local memory, library handles)."""
    taken = free_at_start - torch.cuda.mem_get_info()[0]
    return {f"taken_{when}_bytes": taken,
            f"outside_allocator_{when}_bytes": taken - (torch.cuda.memory_reserved() - reserved_at_start)}


def _budget_case(model: str, recipe: str, context: int, budget: str, prefill_mode: str,
                 fitted_slots: int | None) -> dict:
    """Inside --vram-budget: prefill 512 + 128 decode steps at batch 1, then the whole context."""
    spec = spec_of(model)
    weights = synthetic_weights(spec, BUILTIN_RECIPES[recipe], "cpu", seed=2)
    torch.cuda.init()
    fresh()
    before = torch.cuda.memory_reserved()
    row = dict(model=f"Qwen2.5-{model}", recipe=recipe, context=context, budget=budget,
               budget_bytes=parse_size(budget), reserved_before_bytes=before,
               free_at_start_bytes=torch.cuda.mem_get_info()[0])
    try:
        runner = runner_for_weights(weights, num_slots=fitted_slots or 1, max_context=context, device=DEV,
                                    vram_budget=parse_size(budget), label=f"Qwen2.5-{model} {recipe}",
                                    prefill_mode=prefill_mode, fit=fitted_slots is not None)
    except VramBudgetError as e:
        return row | dict(fits=False, message=str(e))
    except RuntimeError as e:  # CUDA out of memory beside the allocator, on a nearly full card
        traceback.print_exc()
        gc.collect()
        return row | memory_beside_allocator(row["free_at_start_bytes"], before, "at_failure") | dict(
            fits=True, error=f"{type(e).__name__} while building: {str(e).splitlines()[0][:200]}")
    row |= memory_beside_allocator(row["free_at_start_bytes"], before, "built")
    try:
        tps, step_us, pipelined = decode_tokens_per_s(runner, 1, spec.vocab_size)
        drawn = sampled_steps(runner, spec.vocab_size)
        ttft = prefill_time(runner, 512, spec.vocab_size, repeats=1)
        fill = prefill_time(runner, runner.max_context - 1, spec.vocab_size, repeats=1)  # the whole context
        peak = torch.cuda.max_memory_reserved()
        row |= dict(fits=True, plan=runner.plan.describe(), planned_bytes=runner.plan.total_bytes,
                    slots_asked=fitted_slots or 1, slots=runner.num_slots, context_loaded=runner.max_context,
                    planned_prefill_graph_bytes=runner.plan.prefill_graph_bytes,
                    prefill_graph_reserved_bytes=runner.memory_info()["prefill_graph_reserved_bytes"],
                    prefill_mode=runner.prefill_mode, decode_tokens_per_s=tps, graph_step_us=step_us,
                    pipelined_tokens_per_s=pipelined,
                    sampled_draws_on_device=drawn,
                    ttft_512_s=ttft, full_context_prefill_s=fill, peak_reserved_bytes=peak,
                    peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                    within_budget=peak - before <= parse_size(budget))
        row |= memory_beside_allocator(row["free_at_start_bytes"], before, "after_run")
    except torch.cuda.OutOfMemoryError as e:
        row |= dict(fits=True, error=f"out of memory inside the budget: {str(e).splitlines()[0][:200]}")
    finally:
        runner.close()
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", help="JSON file (default: docs/results/decode[_budget]_<gpu>.json, e.g. "
                    "decode_h200.json, decode_budget_rtx_3050_laptop_gpu.json)")
    ap.add_argument("--only", choices=[f"{m}-{r}" for m, r in RUNS], action="append")
    ap.add_argument("--budget-only", action="store_true", help="only the --vram-budget runs")
    ap.add_argument("--launch", choices=programmatic.MODES,
                    help="programmatic dependent launches (SM90+); default: QWEN_TRAY_PDL, else auto")
    args = ap.parse_args()
    require_gpu()
    if args.launch:  # through the environment, so the budget runs' spawned processes see it too
        os.environ[programmatic.ENV_VAR] = args.launch
    # With --budget-only this process never touches the GPU: on a 4 GB card its CUDA context alone
    # would take memory the budget runs' processes need.
    facts = in_fresh_process(device_facts) if args.budget_only else device_facts()
    copy = None if args.budget_only else copy_bandwidth_gbps()
    if not args.budget_only:
        fresh()  # the copy's 2 GiB must not stay cached while a budget run's process plans
    args.out = args.out or default_out(facts["gpu"], args.budget_only)
    result = dict(**facts, date=dt.date.today().isoformat(), commit=args.commit, torch=torch.__version__,
                  copy_gbps=copy, models=[], budget=[])
    # most important first: a timeout then loses the least
    jobs = [("models", m, r, None) for m, r in RUNS[:2]] + [("budget", m, r, c) for m, r, *c in BUDGET_RUNS] + [
        ("models", m, r, None) for m, r in RUNS[2:]]
    for key, model, recipe, context in jobs:
        if (args.only and f"{model}-{recipe}" not in args.only) or (args.budget_only and key != "budget"):
            continue
        if key == "models":
            record(result, key, lambda: bench_model(model, recipe, copy, args.quick), args.out)
        else:
            record(result, key, lambda: bench_budget(model, recipe, *context), args.out)
    print_table(result)


def default_out(gpu_name: str, budget_only: bool) -> str:
    """docs/results/decode[_budget]_<gpu>.json: "NVIDIA H200" -> h200, "NVIDIA GeForce RTX 3050
    Laptop GPU" -> rtx_3050_laptop_gpu (a run on another card never overwrites the H200's file)."""
    return result_path("decode_budget" if budget_only else "decode", gpu_name)


def record(result: dict, key: str, run, out: str) -> None:
    """Run one measurement; a failure is recorded (with its traceback printed) and the rest goes on."""
    try:
        result[key].append(run())
    except Exception as e:  # a bug in one configuration must not lose the others' numbers
        traceback.print_exc()
        result.setdefault("errors", []).append(f"{key}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        fresh()
        return
    print(json.dumps(result[key][-1]), flush=True)
    Path(out).write_text(json.dumps(result, indent=1) + "\n")  # after each: a timeout keeps what was done


def print_table(r: dict) -> None:
    for error in r.get("errors", []):
        print("ERROR", error)
    copy = f"copy {r['copy_gbps']:.0f} GB/s" if r["copy_gbps"] else "copy not measured"
    print(f"\n{r['gpu']} ({r['sms']} SMs), {copy}, torch {r['torch']}, commit {r['commit']}, "
          f"programmatic launches {'on' if r.get('programmatic_launch') else 'off'}")
    print(f"{'model':<18}{'B=1 tok/s':>10}{'pipe':>7}{'graph':>8}{'B=2':>7}{'B=4':>7}{'B=8':>7}{'%copy':>7}"
          f"{'lin-only':>9}{'bf16':>7}{'int4':>7}{'pf512':>8}{'pf2048':>8}{'ttft512':>8}{'peakGiB':>8}")
    for m in r["models"]:
        d, p, peers = m["decode"], m["prefill"], m["peers"]
        lin = 1e6 / m["linears_only_us"]
        print(f"{m['model'] + ' ' + m['recipe']:<18}{d[1]['tokens_per_s']:>10.0f}"
              f"{d[1].get('pipelined_tokens_per_s', 0):>7.0f}{d[1]['graph_tokens_per_s']:>8.0f}"
              f"{d[2]['tokens_per_s']:>7.0f}{d[4]['tokens_per_s']:>7.0f}{d[8]['tokens_per_s']:>7.0f}"
              f"{100 * m['frac_copy']:>6.0f}%{lin:>9.0f}{peers.get('bf16_cublas', {}).get('tokens_per_s', 0):>7.0f}"
              f"{peers.get('int4_tinygemm', {}).get('tokens_per_s', 0):>7.0f}"
              f"{p['gemm_512']['tokens_per_s']:>8.0f}{p.get('gemm_2048', {}).get('tokens_per_s', 0):>8.0f}"
              f"{p['gemm_512']['ttft_s'] * 1e3:>7.0f}ms{m['peak_reserved_bytes'] / GiB:>8.2f}")
    print("\nTTFT at position 0, prefill to CPU logits (first chunk from a CUDA graph vs eager GEMM prefill):")
    for m in r["models"]:
        parts = [f"{n} tokens " + " / ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in row.items())
                 for n, row in m.get("ttft", {}).items()]
        g = m.get("prefill_graphs", {})
        print(f"  {m['model']} {m['recipe']}: " + ", ".join(parts) + (
            f"; graph pool {g['reserved_bytes'] / 2**20:.0f} MiB reserved, {g['planned_bytes'] / 2**20:.0f} MiB planned"
            if g else ""))
    print("\nratios (batch 1 decode, host loop one step at a time; pipelined as the engine decodes):")
    for m in r["models"]:
        size = m["model"].split("-")[1]
        tps = m["decode"][1]["tokens_per_s"]
        peers = m["peers"]
        target = TARGETS.get((size, m["recipe"]))
        prefill = m["prefill"]["gemm_512"]["tokens_per_s"] / LLAMA_CPP[size]["prefill_512"]
        pipe = m["decode"][1].get("pipelined_tokens_per_s", float("nan"))
        parts = [f"vs llama.cpp {LLAMA_CPP[size]['model']} {tps / LLAMA_CPP[size]['decode']:.2f}x "
                 f"(pipelined {pipe / LLAMA_CPP[size]['decode']:.2f}x)",
                 f"prefill vs llama.cpp {prefill:.2f}x"]
        for name in ("bf16_cublas", "int4_tinygemm"):
            if name in peers:
                parts.append(f"vs {name} (linears only) {tps / peers[name]['tokens_per_s']:.2f}x")
        if target:
            parts.append(f"vs target {target}: {tps / target:.2f}x (pipelined {pipe / target:.2f}x)")
        print(f"  {m['model']} {m['recipe']}: " + ", ".join(parts))
    print("\nbudgets:")
    for b in r["budget"]:
        if not b["fits"]:
            print(f"  {b['model']} {b['recipe']} ctx {b['context']}: refused: {b['message']}")
        elif "error" in b:
            print(f"  {b['model']} {b['recipe']} ctx {b['context']}: {b['error']}; "
                  f"{b.get('free_at_start_bytes', 0) / GiB:.2f} GiB free at the start, outside the allocator "
                  f"{b.get('outside_allocator_at_failure_bytes', 0) / MiB:.0f} MiB at the failure")
        else:
            graphs = b.get("prefill_graph_reserved_bytes", 0) / 2**20, b.get("planned_prefill_graph_bytes", 0) / 2**20
            fitted = (f" (fitted: {b['slots_asked']} requests asked, {b['slots']} x {b['context_loaded']} tokens)"
                      if b.get("slots_asked", 1) > 1 else "")
            print(f"  {b['model']} {b['recipe']} ctx {b['context']}{fitted} in {b['budget']}: "
                  f"peak {b['peak_reserved_bytes'] / GiB:.3f} GiB "
                  f"(planned {b['planned_bytes'] / GiB:.3f}; prefill graphs {graphs[0]:.0f} of {graphs[1]:.0f} MiB) "
                  f"within={b['within_budget']}, decode {b['decode_tokens_per_s']:.0f} tok/s "
                  f"(pipelined {b.get('pipelined_tokens_per_s', 0):.0f}), prefill "
                  f"{b['prefill_mode']} ttft512 {b['ttft_512_s'] * 1e3:.0f} ms, "
                  f"full context {b['full_context_prefill_s']:.2f} s, drawn on the device: "
                  f"{', '.join(b.get('sampled_draws_on_device', [])) or 'none'}; "
                  f"{b['free_at_start_bytes'] / GiB:.2f} GiB free at the start, outside the allocator "
                  f"{b['outside_allocator_built_bytes'] / MiB:.0f} MiB built, "
                  f"{b['outside_allocator_after_run_bytes'] / MiB:.0f} MiB after the run")


if __name__ == "__main__":
    main()
