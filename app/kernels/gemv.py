"""Quantized GEMV launchers (gemv.cu): W4A16 / W3A16, batch 1..16, fused epilogues.

- :func:`gemv_w4`, :func:`gemv_w3`: ``y = x @ W^T (+ bias) (+ residual)``.
- :func:`gate_up_silu_w4`, :func:`gate_up_silu_w3`: W = [gate; up] stacked as [2I, K],
  ``y = silu(x @ Wg^T) * (x @ Wu^T)`` -> [M, I], one launch instead of three.

Weights are read in the tile layouts of :mod:`app.kernels.w4_tiles` / :mod:`app.kernels.w3_tiles`
(``repack_w4_tiles(qweight)``, ``repack_w3_tiles(qlow, qhigh)``: ``padded_rows(N)`` rows; N
is the scales' row count, which stay as the checkpoint has them). Gated, I must be a
multiple of 16.

The launch configuration depends on the weight's shape and the GPU only, never on the batch
size, so row m of a batched call is bit-equal to the batch-1 call (greedy batch invariance).
Rows 9..16 (the prefill through the decode graph) take a second block of 8 mma columns that
reuses every dequantized weight fragment: twice the tokens per pass over the weights.
When x is at most ``GemvOptions.stage_x_bytes`` each block first copies it into shared memory
(same values, bit-identical results; its warps then read x apart from the weight streams through
L1, docs/KERNELS.md § GEMV).

Fused RMSNorm (:func:`fuses_norm`: batch 1, x staged up to ``NORM_STAGE_BYTES``): a residual GEMV given ``sums_out``
also writes the chunk sums of squares of its output rows; the next GEMV given
``norm=FusedNorm(weight, sums, eps)`` takes that output h itself as x and computes on
RMSNorm(h), bit-equal to running the norm kernel first (docs/KERNELS.md § Fused norms).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from app.kernels import gemv_preload, loader
from app.kernels.checks import (
    check_multiple, check_optional, check_range, check_tensor, ensure_output, no_overlap,
)
from app.kernels.loader import KernelArgumentError
from app.kernels.tiles import TILE_ROWS, padded_rows

GROUP_SIZE = 128
MAX_BATCH = 16  # batch rows: one mma column each, 8 per column block
COLUMN_BLOCK = 8
MAX_WARPS = 32  # K slices per block (gemv.cu MAX_KSPLIT); above 16 only 32, one tile, unroll 1
MAX_BLOCK_WARPS = 16  # warps of a 512-thread block; 32-slice splits take 1024 threads where they fit
MAX_GROUPS_PER_WARP = 8  # of 128 inputs, in the many-block shapes (default_gemv_config)
MIN_WARPS_PER_SM = 32  # launched in the many-block shapes (default_gemv_config)
# Warps of 64 registers that fill an SM's 64 K registers (SM80-SM90 alike), and the most waves
# of them a split may spread over when default_gemv_config adds warps for groups per warp.
RESIDENT_WARPS_PER_SM = 32
MAX_SPLIT_WAVES = 3
SOURCE = "gemv.cu"
# x is staged in shared memory (gemv.cu STAGE_X) when it is at most this many bytes (M * K * 2):
# batch 1 of the 3B shapes (GemvOptions.stage_x_bytes; 0 turns staging off).
STAGE_X_BYTES = 4096
NORM_CHUNK = 16  # common.cu: a row's sum of squares is summed in chunks of 16 values
# A fused norm stages its normalized x whatever stage_x_bytes says, up to this size (the 7B's
# 7 KB rows). Whether a norm is worth fusing into a GEMV is norm_prologue_bytes's question.
NORM_STAGE_BYTES = 8192
# The decode step fuses a norm only where the fused prologues read at most this much in all
# (x, norm weight and chunk sums, once per block): fusing into the many-block heads and the 7B
# gate/up measured slower than the norm kernel (docs/KERNELS.md § Fused norms).
NORM_PROLOGUE_BYTES = 8 << 20


@dataclass(frozen=True)
class GemvOptions:
    """How the GEMVs launch beyond their split; bit-equal results either way. The defaults are
    the product's; lab/ablate_step.py turns one off to see what it gives."""

    stage_x_bytes: int = STAGE_X_BYTES  # x copied into shared memory up to this size; 0: never
    # the gate/up's weights copied into shared memory before the programmatic wait where its grid
    # fits one wave (app.kernels.gemv_preload, preload_plan)
    preload_weights: bool = True


DEFAULT_OPTIONS = GemvOptions()


@dataclass(frozen=True)
class FusedNorm:
    """x is the residual row h; the GEMV computes on RMSNorm(h) with this ``weight`` [K] fp16,
    from ``sums`` [1, K/16] fp32, the chunk sums the GEMV that wrote h left (``sums_out``)."""

    weight: torch.Tensor
    sums: torch.Tensor
    eps: float


def fuses_norm(m: int, k: int) -> bool:
    """Whether a GEMV with M = m rows of K = k inputs can take a :class:`FusedNorm`."""
    return m == 1 and k % NORM_CHUNK == 0 and m * k * 2 <= NORM_STAGE_BYTES


@dataclass(frozen=True)
class GemvConfig:
    """How a GEMV is split: ``tiles`` 16-row tiles per warp (gate+up tiles when gated),
    ``warps`` per block (they split K: 1..16, or 32 in a 1,024-thread block), ``unroll``
    groups of 128 per pipeline stage (each warp holds two stages: the next one's loads are
    in flight while the current one computes).

    Gated with ``tiles=1``: even warps take the gate tile, odd warps the up tile of the same
    16 outputs (``warps`` must be even), so each warp holds one tile's registers."""

    tiles: int = 1
    warps: int = 8
    unroll: int = 1

    def __post_init__(self) -> None:
        if self.tiles not in (1, 2, 4):
            raise KernelArgumentError(f"GemvConfig.tiles={self.tiles} must be 1, 2 or 4")
        if not (1 <= self.warps <= MAX_BLOCK_WARPS or self.warps == MAX_WARPS):
            raise KernelArgumentError(f"GemvConfig.warps={self.warps} must be 1..{MAX_BLOCK_WARPS} or {MAX_WARPS}")
        if self.warps > MAX_BLOCK_WARPS and (self.tiles, self.unroll) != (1, 1):
            raise KernelArgumentError(f"GemvConfig.warps={self.warps} needs tiles=1 and unroll=1 "
                                      "(1,024-thread blocks leave 64 registers per thread)")
        if self.unroll not in (1, 2, 4):
            raise KernelArgumentError(f"GemvConfig.unroll={self.unroll} must be 1, 2 or 4")
        if self.tiles * self.unroll > 4:  # 512-thread blocks leave 128 registers per thread
            raise KernelArgumentError(f"GemvConfig tiles*unroll={self.tiles * self.unroll} > 4 would spill registers")

    def out_rows_per_block(self, gated: bool) -> int:
        if gated and self.tiles == 1:
            if self.warps % 2:
                raise KernelArgumentError(f"GemvConfig.warps={self.warps} must be even for the gated kernel "
                                          "with tiles=1 (warps alternate gate / up)")
            return TILE_ROWS
        return TILE_ROWS * (self.tiles // 2 if gated else self.tiles)

    def block_warps(self, cols: int = 1) -> int:
        """Warps launched per block: ``warps``, except that a 32-slice split with two column
        blocks (rows 9..16: more than 64 registers) runs two slices on each of 16 warps."""
        return MAX_BLOCK_WARPS if self.warps > MAX_BLOCK_WARPS and cols > 1 else self.warps

    def name_expression(self, bits: int, gated: bool, cols: int = 1, stage_x: bool = False, preload: int = 0) -> str:
        threads = 1024 if self.block_warps(cols) > MAX_BLOCK_WARPS else 512
        gated_s, stage_s = str(gated).lower(), str(stage_x).lower()
        extra = f", {preload}" if preload else ""
        return f"gemv_kernel<{bits}, {self.tiles}, {gated_s}, {self.unroll}, {cols}, {threads}, {stage_s}{extra}>"

    def grid(self, n_out: int, gated: bool) -> tuple[int]:
        rows = self.out_rows_per_block(gated)
        return ((n_out + rows - 1) // rows,)


def default_gemv_config(n_out: int, k: int, gated: bool, sm_count: int) -> GemvConfig:
    """A good split for this shape on a GPU with ``sm_count`` SMs (independent of batch).

    From the config sweeps (docs/KERNELS.md § GEMV splits): one tile per warp (gated: the
    gate and up tiles on alternate warps), one group per pipeline stage (fewer registers, more
    warps resident), and as many warps per block splitting K as it takes to keep loads in
    flight: at least 4 when there are at least 4 blocks per SM (the heads, the MLP gate/up),
    doubled until no warp walks more than 8 groups of 128 (the 7B gate/up: 8 warps) and until
    the grid has at least 32 warps per SM (the 3B gate/up on a 132-SM GPU: 688 blocks, 8 warps
    instead of 4), but never doubled for groups past ``MAX_SPLIT_WAVES`` waves of resident
    warps: on a small GPU (the RTX 3050's 16 SMs) a grid
    of many waves gains nothing from more warps per block, whose warps then wait through the
    block's reduction and warp 0's epilogue holding their registers (the 3050 proxy's sweep:
    the 3B down takes 8 warps there, the 7B down and gate/up 4);
    16 when there are fewer than 2 blocks per SM (the small qkv / o / down projections), else
    8; 32 (a 1,024-thread block) when every block has an SM of its own and K has at least 32
    groups (the 3B down projection on a 132-SM GPU); never more warps than groups of 128 per tile
    (gated: an even number, at least 2).
    """
    blocks = -(-n_out // TILE_ROWS)
    groups = k // GROUP_SIZE
    if blocks >= 4 * sm_count:
        warps = 4
        wave = RESIDENT_WARPS_PER_SM * sm_count
        while (warps < MAX_BLOCK_WARPS and (2 if gated else 1) * groups > MAX_GROUPS_PER_WARP * warps
               and blocks * 2 * warps <= MAX_SPLIT_WAVES * wave):
            warps *= 2
        while warps < MAX_BLOCK_WARPS and blocks * warps < MIN_WARPS_PER_SM * sm_count:
            warps *= 2
    elif blocks <= sm_count and not gated and groups >= MAX_WARPS:
        warps = MAX_WARPS
    elif blocks < 2 * sm_count:
        warps = 16
    else:
        warps = 8
    if gated:
        return GemvConfig(tiles=1, warps=max(2, min(warps, 2 * groups) // 2 * 2), unroll=1)
    return GemvConfig(tiles=1, warps=max(1, min(warps, groups)), unroll=1)


@dataclass(frozen=True)
class _Weights:
    bits: int
    qa: torch.Tensor  # W4 tiles | W3 tiles a
    qb: torch.Tensor | None  # W3 tiles b
    scales: torch.Tensor
    rows: int
    k: int


def _check_w4(tiles: torch.Tensor, scales: torch.Tensor) -> _Weights:
    loader.require()
    check_tensor("scales", scales, torch.float16, (None, None), aligned=False)
    rows, k = scales.shape[0], scales.shape[1] * GROUP_SIZE
    check_tensor("W4 tiles", tiles, torch.int32, (padded_rows(rows), k // 8), device=scales.device)
    return _Weights(4, tiles, None, scales, rows, k)


def _check_w3(a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor) -> _Weights:
    loader.require()
    check_tensor("scales", scales, torch.float16, (None, None), aligned=False)
    rows, k = scales.shape[0], scales.shape[1] * GROUP_SIZE  # a and b: whole tiles, padded
    check_tensor("tiles a", a, torch.int32, (padded_rows(rows), k // 16), device=scales.device)
    check_tensor("tiles b", b, torch.int32, (padded_rows(rows), k // 32), device=scales.device)
    return _Weights(3, a, b, scales, rows, k)


def norm_prologue_bytes(n_out: int, k: int, gated: bool, device: torch.device) -> int:
    """What the blocks of a GEMV with a fused norm read in their prologues (batch 1): x, the
    norm weight and the chunk sums, once per block of the default config."""
    blocks = default_gemv_config(n_out, k, gated, loader.sm_count(device)).grid(n_out, gated)[0]
    return blocks * (2 * k * 2 + k // NORM_CHUNK * 4)


def most_staged_x_bytes(k: int, stage_x_bytes: int = STAGE_X_BYTES) -> int:
    """The largest x any batch of M <= 8 stages in shared memory for a GEMV of K = k inputs."""
    staged = [m * k * 2 for m in range(1, COLUMN_BLOCK + 1) if m * k * 2 <= stage_x_bytes]
    if fuses_norm(1, k):
        staged.append(k * 2)
    return max(staged, default=0)


def preload_plan(bits: int, n_out: int, k: int, gated: bool, device: torch.device,
                 options: GemvOptions = DEFAULT_OPTIONS) -> gemv_preload.PreloadPlan | None:
    """Whether (and with which split) a GEMV of this shape preloads its weights on ``device``.

    Only the gated gate/up GEMV does: it follows the attention block and the o projection,
    latency-bound kernels that leave DRAM idle while its blocks copy (docs/KERNELS.md
    § Preloaded weights). Preloading the qkv and o made the step slower (their default splits
    walk one group per warp, which the register stage already covers, so the plan halves their
    warps), and the down projection gained nothing (it follows the gate/up, which keeps DRAM busy).
    Decided once per process, shape and device (whether launches are programmatic included),
    so a weight keeps one split, and its bits, for the whole run.
    """
    if not options.preload_weights or not gated or device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _preload_plan(bits, n_out, k, gated, index, options.stage_x_bytes)


@functools.lru_cache(maxsize=None)
def _preload_plan(bits: int, n_out: int, k: int, gated: bool, device_index: int, stage_x_bytes: int):
    with torch.cuda.device(device_index):
        if not loader.programmatic_launches():
            return None  # no window before the wait to fill
        sm_count = loader.sm_count(torch.device("cuda", device_index))
        base = default_gemv_config(n_out, k, gated, sm_count)

        def resident(warps: int, bound: int, shared: int) -> int:
            cfg = GemvConfig(tiles=1, warps=warps, unroll=1)
            kernel = loader.get_kernel(SOURCE, cfg.name_expression(bits, gated, 1, True, bound))
            return loader.resident_blocks(kernel, 32 * cfg.block_warps(1), shared)

        return gemv_preload.plan(n_out, k, gated, bits, base.warps, sm_count, most_staged_x_bytes(k, stage_x_bytes),
                                 resident)


def _run(w: _Weights, x: torch.Tensor, *, gated: bool, bias: torch.Tensor | None,
         residual: torch.Tensor | None, out: torch.Tensor | None, config: GemvConfig | None,
         norm: FusedNorm | None = None, sums_out: torch.Tensor | None = None,
         options: GemvOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    dev = w.qa.device
    check_tensor("x", x, torch.float16, (None, w.k), device=dev)
    m = check_range("batch (x.shape[0])", x.shape[0], 1, MAX_BATCH)
    if gated:
        check_multiple("gate/up rows", w.rows, 2 * TILE_ROWS)
    n_out = w.rows // 2 if gated else w.rows
    bias_ptr = check_optional("bias", bias, torch.float16, (n_out,), device=dev, aligned=False)
    res_ptr = check_optional("residual", residual, torch.float16, (m, n_out), device=dev, aligned=False)
    y = ensure_output("out", out, (m, n_out), torch.float16, dev)
    no_overlap("x", x, "out", y)
    if residual is not None and residual.data_ptr() != y.data_ptr():
        no_overlap("residual", residual, "out", y)  # in place (residual is out) is fine
    norm_args = _norm_args(norm, m, w.k, dev)
    sums_ptr = 0
    if sums_out is not None:
        if gated:
            raise KernelArgumentError("sums_out: the gated kernel writes no chunk sums")
        check_multiple("sums_out: output features", n_out, NORM_CHUNK)
        check_tensor("sums_out", sums_out, torch.float32, (m, n_out // NORM_CHUNK), device=dev)
        sums_ptr = sums_out.data_ptr()
    cols = -(-m // COLUMN_BLOCK)  # rows 0..7 are computed the same way whatever M is (batch invariance)
    plan = preload_plan(w.bits, n_out, w.k, gated, dev, options) if config is None else None
    if plan is not None:  # its split for every batch; the copies only with one column block
        cfg = GemvConfig(tiles=1, warps=plan.warps, unroll=1)
    else:
        cfg = config or default_gemv_config(n_out, w.k, gated, loader.sm_count(dev))
    preload = plan.groups if plan is not None and cols == 1 else 0
    if cols > 1 and cfg.tiles * cfg.unroll * cols > 4:  # registers (spills) and shared memory
        raise KernelArgumentError(f"GemvConfig tiles*unroll={cfg.tiles * cfg.unroll} supports at most "
                                  f"{COLUMN_BLOCK} batch rows (at most 2 for {MAX_BATCH}), got {m} rows")
    x_bytes = m * w.k * 2
    stage_x = x_bytes <= options.stage_x_bytes or norm is not None
    kernel = loader.get_kernel(SOURCE, cfg.name_expression(w.bits, gated, cols, stage_x, preload))
    qb_ptr = w.qb.data_ptr() if w.qb is not None else 0
    args = (w.qa.data_ptr(), qb_ptr, w.scales.data_ptr(), x.data_ptr(), bias_ptr, res_ptr, y.data_ptr(),
            np.int32(m), np.int32(n_out), np.int32(w.k), np.int32(cfg.warps), *norm_args, sums_ptr)
    shared = (x_bytes if stage_x else 0) + (plan.weight_bytes if preload else 0)
    loader.launch(kernel, cfg.grid(n_out, gated), (32 * cfg.block_warps(cols),), args, shared_mem=shared)
    return y


def _norm_args(norm: FusedNorm | None, m: int, k: int, dev: torch.device) -> tuple:
    """(norm_w, norm_sums, eps) kernel arguments; null pointers without a fused norm."""
    if norm is None:
        return 0, 0, np.float32(0)
    if not fuses_norm(m, k):
        raise KernelArgumentError(f"a fused norm needs batch 1 and K a multiple of {NORM_CHUNK} with "
                                  f"K * 2 <= {NORM_STAGE_BYTES} bytes (staged x), got M={m}, K={k}")
    check_tensor("norm weight", norm.weight, torch.float16, (k,), device=dev)
    check_tensor("norm sums", norm.sums, torch.float32, (None, k // NORM_CHUNK), device=dev)
    return norm.weight.data_ptr(), norm.sums.data_ptr(), np.float32(norm.eps)


def gemv_w4(x: torch.Tensor, tiles: torch.Tensor, scales: torch.Tensor, *, bias: torch.Tensor | None = None,
            residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
            config: GemvConfig | None = None, norm: FusedNorm | None = None,
            sums_out: torch.Tensor | None = None, options: GemvOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """x [M<=16, K] fp16 @ W4 [N, K]^T (+ bias [N]) (+ residual [M, N]) -> [M, N] fp16; W in the tile
    layout (``tiles`` [padded_rows(N), K/8], ``scales`` [N, K/128]).

    ``out`` may be ``residual`` itself (in-place residual add). ``norm``: x is RMSNorm'd first
    (batch 1, see :class:`FusedNorm`). ``sums_out`` [M, N/16] fp32: the chunk sums of squares
    of the output rows, for a fused norm in the next GEMV. ``options``: x staging, weight preload.
    """
    return _run(_check_w4(tiles, scales), x, gated=False, bias=bias, residual=residual, out=out, config=config,
                norm=norm, sums_out=sums_out, options=options)


def gemv_w3(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, *,
            bias: torch.Tensor | None = None, residual: torch.Tensor | None = None,
            out: torch.Tensor | None = None, config: GemvConfig | None = None, norm: FusedNorm | None = None,
            sums_out: torch.Tensor | None = None, options: GemvOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """Like :func:`gemv_w4` for W3 in the tile layout (a [Np, K/16], b [Np, K/32], Np = padded_rows(N))."""
    return _run(_check_w3(a, b, scales), x, gated=False, bias=bias, residual=residual, out=out,
                config=config, norm=norm, sums_out=sums_out, options=options)


def gate_up_silu_w4(x: torch.Tensor, tiles: torch.Tensor, scales: torch.Tensor, *,
                    out: torch.Tensor | None = None, config: GemvConfig | None = None,
                    norm: FusedNorm | None = None, options: GemvOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """x [M, K] with W4 [gate; up] of shape [2I, K] (tile layout) -> silu(x Wg^T) * (x Wu^T), [M, I] fp16."""
    return _run(_check_w4(tiles, scales), x, gated=True, bias=None, residual=None, out=out, config=config,
                norm=norm, options=options)


def gate_up_silu_w3(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scales: torch.Tensor, *,
                    out: torch.Tensor | None = None, config: GemvConfig | None = None,
                    norm: FusedNorm | None = None, options: GemvOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """Like :func:`gate_up_silu_w4` for W3 in the tile layout (I % 16 == 0)."""
    return _run(_check_w3(a, b, scales), x, gated=True, bias=None, residual=None, out=out,
                config=config, norm=norm, options=options)
