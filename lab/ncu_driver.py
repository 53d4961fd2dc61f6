#!/usr/bin/env python3
"""Launch each decode kernel once on real Qwen2.5 shapes inside an NVTX range, for Nsight Compute.

    ncu --nvtx --nvtx-include "profile/" --set full python -m lab.ncu_driver > ncu.txt

Everything is launched once outside the range first (NVRTC compile, caches), so the profiled
launches are the steady-state ones. ``--only NAME`` (repeatable) restricts the cases.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import DEV, gemv_cases, gemv_fn, rand_weights

from app.kernels import DecodeAttentionWorkspace, decode_attention, default_num_splits

GEMV_CASES = ("3b_w4.qkv", "3b_w4.o", "3b_w4.gate_up", "3b_w4.down", "7b_mixed.gate_up", "7b_mixed.down")
CONTEXT = 640


def gemv_launches() -> dict:
    out = {}
    for model in ("3b_w4", "7b_mixed"):
        for name, bits, n, k, gated in gemv_cases(model):
            if name in GEMV_CASES:
                x = torch.randn(1, k, device=DEV).half()
                out[name] = gemv_fn(bits, gated, rand_weights(bits, n, k, 1), x)
    return out


def attention_launch(hq: int, hkv: int, d: int = 128, max_context: int = 4096):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    k_cache = torch.randn(1, hkv, max_context, d, device=DEV).half()
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(1, hq, d, device=DEV).half()
    lens, slots = (torch.tensor([v], dtype=torch.int32, device=DEV) for v in (CONTEXT, 0))
    ws = DecodeAttentionWorkspace.allocate(1, hq, d, default_num_splits(hkv, max_context, sms), DEV)
    out = torch.empty_like(q)
    return lambda _i: decode_attention(q, k_cache, v_cache, lens, slots, workspace=ws, out=out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append")
    args = ap.parse_args()
    cases = gemv_launches()
    cases["3b.attention"] = attention_launch(16, 2)
    cases["7b.attention"] = attention_launch(28, 4)
    cases = {k: v for k, v in cases.items() if not args.only or k in args.only}
    for fn in cases.values():
        fn(0)
    torch.cuda.synchronize()
    for name, fn in cases.items():
        torch.cuda.nvtx.range_push("profile")
        fn(0)
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        print("profiled", name, flush=True)


if __name__ == "__main__":
    main()
