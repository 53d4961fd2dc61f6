#!/usr/bin/env python3
"""Are two source trees' GEMVs bit-identical? Outputs for fixed inputs, saved or compared (GPU).

Every GEMV entry point (W4 / W3, plain and gated, bias, residual, in place, chunk sums, the
fused norm; M = 1-16; three configs; seven shapes) on inputs from a fixed seed. Run it in the
old tree to save, then in the new one to compare (docs/history/kernels/phase-11.md); the tree
whose ``app`` is measured is the first on PYTHONPATH:

    PYTHONPATH=OLD_TREE python lab/gemv_bitexact.py /tmp/old.pt
    PYTHONPATH=$PWD python lab/gemv_bitexact.py /tmp/new.pt /tmp/old.pt   # prints "N of N outputs identical"
"""
import sys

import torch
from app.kernels import GemvConfig, gate_up_silu_w3, gate_up_silu_w4, gemv_w3, gemv_w4
from app.kernels.gemv import FusedNorm
from app.kernels.tiles import padded_rows

SHAPES = ((2051, 1152), (77, 384), (2560, 2048), (1056, 1152), (2048, 2048), (2048, 11008), (4608, 3584))
GEN = torch.Generator(device="cuda").manual_seed(0)


def rnd(*shape) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", generator=GEN).half()


def words(*shape) -> torch.Tensor:
    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device="cuda", generator=GEN)


def weight(bits: int, n: int, k: int) -> tuple:
    scales = (torch.rand(n, k // 128, device="cuda", generator=GEN) * 0.02 + 0.001).half()
    rows = padded_rows(n)
    return (words(rows, k // 8), scales) if bits == 4 else (words(rows, k // 16), words(rows, k // 32), scales)


def batch_outputs(res: dict, f, fg, w: tuple, n: int, k: int, bits: int, bias: torch.Tensor) -> None:
    for m in (1, 3, 8, 11, 16):
        x, r = rnd(m, k), rnd(m, n)
        key = (n, k, bits, m)
        res[key] = f(x, *w)
        res[(*key, "bias")] = f(x, *w, bias=bias)
        res[(*key, "res")] = f(x, *w, residual=r)
        h = r.clone()
        res[(*key, "inplace")] = f(x, *w, residual=h, out=h)
        if n % 16 == 0:
            sums, h2 = torch.full((m, n // 16), float("nan"), device="cuda"), r.clone()
            res[(*key, "sums_y")], res[(*key, "sums")] = f(x, *w, residual=h2, out=h2, sums_out=sums), sums
        if n % 32 == 0:
            res[(*key, "gated")] = fg(x, *w)
        for cfg in (GemvConfig(tiles=2, warps=4, unroll=1), GemvConfig(tiles=1, warps=2, unroll=2)):
            if m <= 8:
                res[(*key, str(cfg))] = f(x, *w, config=cfg, residual=r)


def outputs() -> dict:
    res = {}
    for n, k in SHAPES:
        for bits in (4, 3):
            f, fg = (gemv_w4, gate_up_silu_w4) if bits == 4 else (gemv_w3, gate_up_silu_w3)
            w = weight(bits, n, k)
            batch_outputs(res, f, fg, w, n, k, bits, rnd(n))
            if k % 16 == 0 and k * 2 <= 8192:  # the fused norm: batch 1, x staged
                hrow = rnd(1, k)
                norm = FusedNorm(rnd(k), (hrow.float().view(1, k // 16, 16) ** 2).sum(-1).contiguous(), 1e-6)
                res[(n, k, bits, "norm")] = f(hrow, *w, norm=norm)
                if n % 32 == 0:
                    res[(n, k, bits, "norm_gated")] = fg(hrow, *w, norm=norm)
    torch.cuda.synchronize()
    return {key: v.cpu() for key, v in res.items()}


def main() -> None:
    res = outputs()
    if len(sys.argv) > 2:
        other = torch.load(sys.argv[2])
        bad = [key for key in res if not torch.equal(res[key].nan_to_num(7), other[key].nan_to_num(7))]
        print(f"bit-exact check: {len(res) - len(bad)} of {len(res)} outputs identical; differing: {bad[:10]}")
    else:
        torch.save(res, sys.argv[1])


if __name__ == "__main__":
    main()
