#!/usr/bin/env python3
"""One launch of each side of probe_persistent_mlp.py, for Nsight Compute (docs/history/kernels/phase-22.md:
is the persistent MLP bound by instruction issue, and are the product's GEMVs?).

    ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats \\
        --section LaunchStats python -m lab.profile_persistent_mlp --variants 3:1:0:0:1,3:1:0:2:1

Runs the product chain for one layer (its gate/up and down kernels) and each persistent variant
over all layers, once each after a warm-up; ncu profiles every launch it sees.
"""

from __future__ import annotations

import argparse

import torch

from lab.persistent_records import DEV, HIDDEN, INTER, build_records
from lab.probe_persistent_mlp import (build, compile_persistent, norm_chunk_sums_ref, persistent_chain,
                                  product_chain)

from app.kernels import loader


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--variants", default="3:1:0:0:1,3:1:0:2:1", help="ring:math:bulk:layout:pieces")
    args = ap.parse_args()
    w = build(args.layers, 0)
    h = torch.randn(1, HIDDEN, device=DEV).half()
    sums = norm_chunk_sums_ref(h).contiguous()
    a = torch.empty(1, INTER, dtype=torch.float16, device=DEV)
    counter = torch.zeros(1, dtype=torch.int32, device=DEV)
    runs = [product_chain(w, h, sums, a, 1)]
    for spec in args.variants.split(","):
        ring, math, bulk, layout, pieces = (int(x) for x in spec.split(":"))
        kernel = compile_persistent(ring, bool(math), bool(bulk), pieces, layout)
        records = build_records(w, loader.sm_count(h.device), layout, pieces) if layout else None
        runs.append(persistent_chain(kernel, ring * pieces, w, h, sums, a, counter, args.layers, records=records))
    for run in runs:
        run()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
