"""Launcher for GQA decode attention over the static KV cache (attention.cu).

One launch by default: per-split partial softmax over a few query heads per block, and the
last block of each (sequence, head group) merges the splits (``AttentionConfig.single_pass``);
the two-pass form (split kernel + combine kernel) is kept for comparison. ``num_splits`` is
fixed per engine (model, device, max context), never per batch or per step, so CUDA graphs
can be captured once and results do not depend on the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_range, check_tensor, ensure_output
from app.kernels.loader import KernelArgumentError

HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per kv head
MAX_SPLITS = 256
LOG2E = 1.4426950408889634
COMBINE_PARTS = 4  # threads per output element in the combine (keep in sync with attention.cu)
# The default form (benchmarks/ablate_step.py compares the two-pass one in place).
SINGLE_PASS = True


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """How the decode attention kernel is cut into blocks (results depend on it; fixed per engine)."""

    heads_per_block: int  # query heads of one kv head per block (capped at the group size)
    warps: int  # per block
    single_pass: bool  # the last block of a sequence merges the splits (no combine kernel)
    min_chunk: int  # positions per split at least (short contexts use fewer splits)

    def __post_init__(self) -> None:
        check_range("heads_per_block", self.heads_per_block, 1, MAX_GROUP)
        if self.warps not in (2, 4, 8, 16):
            raise KernelArgumentError(f"warps={self.warps} must be 2, 4, 8 or 16")
        if self.heads_per_block * self.warps > 32:  # each warp's partial of each head in shared memory
            raise KernelArgumentError(f"heads_per_block x warps = {self.heads_per_block * self.warps} is more "
                                      "than 32 (the block's shared memory would pass 48 KB)")
        check_range("min_chunk", self.min_chunk, 1, 1 << 20)

    def head_groups(self, group: int) -> int:
        """Blocks per kv head and split: the group's query heads, ``heads_per_block`` at a time."""
        return -(-group // min(self.heads_per_block, group))


# Two heads and 8 warps per block, 32 positions (two key steps per warp) per split at least.
SINGLE_PASS_CONFIG = AttentionConfig(heads_per_block=2, warps=8, single_pass=True, min_chunk=32)
# The phase 1-10 kernel: every head of the group in a 4-warp block, then the combine kernel.
TWO_PASS_CONFIG = AttentionConfig(heads_per_block=MAX_GROUP, warps=4, single_pass=False, min_chunk=16)
MIN_CHUNK = TWO_PASS_CONFIG.min_chunk  # (the two-pass default; bench_attention sweeps it)


def attention_config() -> AttentionConfig:
    return SINGLE_PASS_CONFIG if SINGLE_PASS else TWO_PASS_CONFIG


def default_num_splits(num_q_heads: int, num_kv_heads: int, max_context: int, sm_count: int,
                       config: AttentionConfig | None = None) -> int:
    """Enough splits that one sequence alone gives every SM two blocks, no more than useful."""
    config = config or attention_config()
    blocks_per_split = num_kv_heads * config.head_groups(max(1, num_q_heads // max(1, num_kv_heads)))
    want = math.ceil(2 * sm_count / blocks_per_split)
    useful = math.ceil(max_context / config.min_chunk)
    return max(1, min(want, useful, MAX_SPLITS))


@dataclass
class DecodeAttentionWorkspace:
    """fp32 partial results and the single pass's counters, allocated once per engine (graph-safe)."""

    part_o: torch.Tensor  # [B, Hq, splits, D]
    part_ml: torch.Tensor  # [B, Hq, splits, 2]
    counters: torch.Tensor  # int32 [B, Hq]: zero between launches (each merging block resets its own)

    def __post_init__(self) -> None:
        b, hq, s, d = self.part_o.shape
        if tuple(self.part_ml.shape) != (b, hq, s, 2):
            raise KernelArgumentError(f"part_ml shape {list(self.part_ml.shape)} does not match part_o {[b, hq, s, d]}")
        if tuple(self.counters.shape) != (b, hq):
            raise KernelArgumentError(f"counters shape {list(self.counters.shape)} is not {[b, hq]}")

    @classmethod
    def allocate(cls, max_batch: int, num_q_heads: int, head_dim: int, num_splits: int,
                 device: torch.device | str) -> DecodeAttentionWorkspace:
        check_range("num_splits", num_splits, 1, MAX_SPLITS)
        return cls(torch.empty((max_batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=device),
                   torch.empty((max_batch, num_q_heads, num_splits, 2), dtype=torch.float32, device=device),
                   torch.zeros((max_batch, num_q_heads), dtype=torch.int32, device=device))

    @property
    def num_splits(self) -> int:
        return self.part_o.shape[2]

    @property
    def nbytes(self) -> int:
        return (self.part_o.numel() + self.part_ml.numel() + self.counters.numel()) * 4


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                     slots: torch.Tensor, *, scale: float | None = None,
                     workspace: DecodeAttentionWorkspace | None = None, out: torch.Tensor | None = None,
                     min_chunk: int | None = None, config: AttentionConfig | None = None) -> torch.Tensor:
    """softmax(q K^T * scale) V for one new token per sequence -> [B, Hq, D] fp16.

    q [B, Hq, D] fp16; caches [S, Hkv, L, D] fp16; seq_lens, slots int32 [B] on the GPU
    (sequence b attends to positions 0..seq_lens[b]-1 of slot slots[b]; lengths past L are
    clamped, a length of 0 or a slot out of range gives zeros). ``workspace`` (required for graph capture) fixes
    the number of splits; without it one is allocated for this call. ``config`` (default
    :func:`attention_config`) and ``min_chunk`` (default the config's) cut the work into blocks;
    results depend on them, and the workspace's splits must have been chosen for the same config.
    """
    config = config or attention_config()
    min_chunk = check_range("min_chunk", config.min_chunk if min_chunk is None else min_chunk, 1, 1 << 20)
    loader.require()
    batch, hq, hkv, head_dim, group = _check_shapes(q, k_cache, v_cache, seq_lens, slots)
    num_slots, _, max_len, _ = k_cache.shape
    dev = q.device
    if workspace is None:
        props = torch.cuda.get_device_properties(dev)
        splits = default_num_splits(hq, hkv, max_len, props.multi_processor_count, config)
        workspace = DecodeAttentionWorkspace.allocate(batch, hq, head_dim, splits, dev)
    _check_workspace(workspace, batch, hq, head_dim, dev)
    o = ensure_output("out", out, (batch, hq, head_dim), torch.float16, dev)
    if batch == 0:
        return o
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    heads = min(config.heads_per_block, group)
    single = "true" if config.single_pass else "false"
    split_kernel = loader.get_kernel("attention.cu",
                                     f"attn_split_kernel<{head_dim}, {group}, {heads}, {config.warps}, {single}>")
    splits = workspace.num_splits
    part_o, part_ml = workspace.part_o.data_ptr(), workspace.part_ml.data_ptr()
    loader.launch(split_kernel, (splits * config.head_groups(group), hkv, batch), (32 * config.warps,),
                  (q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), seq_lens.data_ptr(), slots.data_ptr(),
                   part_o, part_ml, workspace.counters.data_ptr(), o.data_ptr(), np.int32(hkv), np.int32(max_len),
                   np.int32(num_slots), np.int32(splits), np.int32(min_chunk), np.float32(scale * LOG2E)))
    if not config.single_pass:
        combine_kernel = loader.get_kernel("attention.cu", f"attn_combine_kernel<{head_dim}>")
        loader.launch(combine_kernel, (hq, batch), (COMBINE_PARTS * head_dim,),
                      (part_o, part_ml, seq_lens.data_ptr(), slots.data_ptr(), o.data_ptr(), np.int32(hq),
                       np.int32(max_len), np.int32(num_slots), np.int32(splits), np.int32(min_chunk)))
    return o


def _check_shapes(q, k_cache, v_cache, seq_lens, slots) -> tuple[int, int, int, int, int]:
    """(batch, Hq, Hkv, head_dim, group) of valid inputs; a KernelArgumentError names what is not."""
    check_tensor("q", q, torch.float16, (None, None, None))
    batch, hq, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise KernelArgumentError(f"head_dim={head_dim} is not supported (only {HEAD_DIMS})")
    dev = q.device
    check_tensor("k_cache", k_cache, torch.float16, (None, None, None, head_dim), device=dev)
    hkv = k_cache.shape[1]
    check_tensor("v_cache", v_cache, torch.float16, tuple(k_cache.shape), device=dev)
    if hq % hkv:
        raise KernelArgumentError(f"{hq} query heads are not a multiple of {hkv} kv heads")
    group = check_range("query heads per kv head", hq // hkv, 1, MAX_GROUP)
    check_tensor("seq_lens", seq_lens, torch.int32, (batch,), device=dev, aligned=False)
    check_tensor("slots", slots, torch.int32, (batch,), device=dev, aligned=False)
    return batch, hq, hkv, head_dim, group


def _check_workspace(workspace: DecodeAttentionWorkspace, batch: int, hq: int, head_dim: int, dev) -> None:
    ws_b, ws_hq, _, ws_d = workspace.part_o.shape
    if ws_b < batch or ws_hq != hq or ws_d != head_dim:
        raise KernelArgumentError(f"workspace [{ws_b}, {ws_hq}, *, {ws_d}] does not fit batch {batch}, "
                                  f"{hq} heads, head_dim {head_dim}")
    for name, t, dtype in (("workspace.part_o", workspace.part_o, torch.float32),
                           ("workspace.part_ml", workspace.part_ml, torch.float32),
                           ("workspace.counters", workspace.counters, torch.int32)):
        check_tensor(name, t, dtype, tuple(t.shape), device=dev)
