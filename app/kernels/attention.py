"""Launchers for GQA decode attention over the static KV cache (attention.cu).

Two launches: per-split partial softmax (grid: splits x kv heads x batch) and the combine.
``num_splits`` is fixed per engine (model, device, max context), never per batch or per
step, so CUDA graphs can be captured once and results do not depend on the batch.
:func:`rope_decode_attention` is the decode step's form: RoPE + KV write (rope.cu) done by
the split kernel itself, bit-equal to :func:`~app.kernels.norm_rope.rope_kv_write` followed
by :func:`decode_attention`, one dependent launch fewer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from app.kernels import loader
from app.kernels.checks import check_range, check_tensor, ensure_output
from app.kernels.loader import KernelArgumentError
from app.kernels.norm_rope import check_rope_tables

HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per kv head
MIN_CHUNK = 16  # positions per split at least (short contexts use fewer splits)
MAX_SPLITS = 256
LOG2E = 1.4426950408889634
COMBINE_PARTS = 4  # threads per output element in the combine (keep in sync with attention.cu)
ROPE_MAX_ROWS = 32  # rows per fused launch (attention.cu: one lane each)
ROPE_WINDOW = 16  # new positions of one slot per fused launch, consecutive (attention.cu)


def default_num_splits(num_kv_heads: int, max_context: int, sm_count: int) -> int:
    """Enough splits that one sequence alone gives every SM two blocks, no more than useful."""
    want = math.ceil(2 * sm_count / num_kv_heads)
    useful = math.ceil(max_context / MIN_CHUNK)
    return max(1, min(want, useful, MAX_SPLITS))


@dataclass
class DecodeAttentionWorkspace:
    """fp32 partial results, allocated once per engine (graph-safe)."""

    part_o: torch.Tensor  # [B, Hq, splits, D]
    part_ml: torch.Tensor  # [B, Hq, splits, 2]

    def __post_init__(self) -> None:
        b, hq, s, d = self.part_o.shape
        if tuple(self.part_ml.shape) != (b, hq, s, 2):
            raise KernelArgumentError(f"part_ml shape {list(self.part_ml.shape)} does not match part_o {[b, hq, s, d]}")

    @classmethod
    def allocate(cls, max_batch: int, num_q_heads: int, head_dim: int, num_splits: int,
                 device: torch.device | str) -> DecodeAttentionWorkspace:
        check_range("num_splits", num_splits, 1, MAX_SPLITS)
        return cls(torch.empty((max_batch, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=device),
                   torch.empty((max_batch, num_q_heads, num_splits, 2), dtype=torch.float32, device=device))

    @property
    def num_splits(self) -> int:
        return self.part_o.shape[2]

    @property
    def nbytes(self) -> int:
        return self.part_o.numel() * 4 + self.part_ml.numel() * 4


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                     slots: torch.Tensor, *, scale: float | None = None,
                     workspace: DecodeAttentionWorkspace | None = None, out: torch.Tensor | None = None,
                     min_chunk: int = MIN_CHUNK) -> torch.Tensor:
    """softmax(q K^T * scale) V for one new token per sequence -> [B, Hq, D] fp16.

    q [B, Hq, D] fp16; caches [S, Hkv, L, D] fp16; seq_lens, slots int32 [B] on the GPU
    (sequence b attends to positions 0..seq_lens[b]-1 of slot slots[b]; lengths past L are
    clamped, a length of 0 or a slot out of range gives zeros). ``workspace`` (required for graph capture) fixes
    the number of splits; without it one is allocated for this call. ``min_chunk``: positions per
    split at least (benchmarks sweep it; results depend on it). seq_lens and slots are read
    before the programmatic wait (docs/KERNELS.md § Fused RoPE and KV write): the kernel launched just before
    must not write them (a copy or a PyTorch op may).
    """
    loader.require()
    check_tensor("q", q, torch.float16, (None, None, None))
    batch, hq, head_dim = q.shape
    launch = _AttentionLaunch.checked(q.device, batch, hq, head_dim, k_cache, v_cache, seq_lens, slots,
                                      scale, workspace, out, min_chunk)
    if batch:
        launch.run(q, hq * head_dim, rope=None)
    return launch.out


def rope_decode_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                          seq_lens: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          *, num_q_heads: int, scale: float | None = None,
                          workspace: DecodeAttentionWorkspace | None = None, out: torch.Tensor | None = None,
                          min_chunk: int = MIN_CHUNK) -> torch.Tensor:
    """``rope_kv_write`` then ``decode_attention`` in the attention's launches (same bits).

    qkv [B, (Hq + 2 Hkv) D] fp16, the fused projection of each row's new token; cos/sin, positions,
    slots as for ``rope_kv_write``; seq_lens as for ``decode_attention``. Row b's k and v are written at
    (slots[b], positions[b]), and row b attends to positions 0..seq_lens[b]-1 of its slot. Meant
    for decode steps: B <= 32, seq_lens[b] = positions[b] + 1, and the rows of one slot (the
    graph prefill's consecutive tokens) within 16 consecutive positions; positions, seq_lens
    and slots not written by the kernel launched just before (see ``decode_attention``).
    Returns [B, Hq, D].
    """
    loader.require()
    check_tensor("qkv", qkv, torch.float16, (None, None))
    batch, width = qkv.shape
    check_range("rows of a fused RoPE attention", batch, 0, ROPE_MAX_ROWS)
    hq = check_range("num_q_heads", num_q_heads, 1, 1 << 16)
    hkv = check_tensor("k_cache", k_cache, torch.float16, (None, None, None, None), device=qkv.device).shape[1]
    if hkv < 1 or width % (hq + 2 * hkv):
        raise KernelArgumentError(f"qkv width {width} is not (num_q_heads={hq} + 2*num_kv_heads={hkv}) * head_dim")
    head_dim = width // (hq + 2 * hkv)
    launch = _AttentionLaunch.checked(qkv.device, batch, hq, head_dim, k_cache, v_cache, seq_lens, slots,
                                      scale, workspace, out, min_chunk)
    check_rope_tables(cos, sin, head_dim, qkv.device, vector_loads=True)
    check_tensor("positions", positions, torch.int32, (batch,), device=qkv.device, aligned=False)
    if batch:
        launch.run(qkv, width, rope=(positions, cos, sin))
    return launch.out


@dataclass
class _AttentionLaunch:
    """The checked arguments of one attention: everything but where q comes from."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    seq_lens: torch.Tensor
    slots: torch.Tensor
    workspace: DecodeAttentionWorkspace
    out: torch.Tensor
    group: int
    scale: float
    min_chunk: int

    @classmethod
    def checked(cls, dev, batch, hq, head_dim, k_cache, v_cache, seq_lens, slots, scale, workspace, out,
                min_chunk) -> _AttentionLaunch:
        check_range("min_chunk", min_chunk, 1, 1 << 20)
        if head_dim not in HEAD_DIMS:
            raise KernelArgumentError(f"head_dim={head_dim} is not supported (only {HEAD_DIMS})")
        check_tensor("k_cache", k_cache, torch.float16, (None, None, None, head_dim), device=dev)
        hkv = k_cache.shape[1]
        check_tensor("v_cache", v_cache, torch.float16, tuple(k_cache.shape), device=dev)
        if hq % hkv:
            raise KernelArgumentError(f"{hq} query heads are not a multiple of {hkv} kv heads")
        group = check_range("query heads per kv head", hq // hkv, 1, MAX_GROUP)
        check_tensor("seq_lens", seq_lens, torch.int32, (batch,), device=dev, aligned=False)
        check_tensor("slots", slots, torch.int32, (batch,), device=dev, aligned=False)
        if workspace is None:
            splits = default_num_splits(hkv, k_cache.shape[2], loader.sm_count(dev))
            workspace = DecodeAttentionWorkspace.allocate(batch, hq, head_dim, splits, dev)
        ws_b, ws_hq, _, ws_d = workspace.part_o.shape
        if ws_b < batch or ws_hq != hq or ws_d != head_dim:
            raise KernelArgumentError(f"workspace [{ws_b}, {ws_hq}, *, {ws_d}] does not fit batch {batch}, "
                                      f"{hq} heads, head_dim {head_dim}")
        for name, t in (("workspace.part_o", workspace.part_o), ("workspace.part_ml", workspace.part_ml)):
            check_tensor(name, t, torch.float32, tuple(t.shape), device=dev)
        o = ensure_output("out", out, (batch, hq, head_dim), torch.float16, dev)
        scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
        return cls(k_cache, v_cache, seq_lens, slots, workspace, o, group, scale, min_chunk)

    def run(self, q: torch.Tensor, q_stride: int, rope) -> None:
        """The split kernel reading q rows of ``q_stride`` elements (rope: (positions, cos, sin),
        q is then the qkv rows), then the combine."""
        batch, hq, head_dim = self.out.shape
        num_slots, hkv, max_len, _ = self.k_cache.shape
        splits = self.workspace.num_splits
        fused = rope is not None
        split_kernel = loader.get_kernel("attention.cu", f"attn_split_kernel<{head_dim}, {self.group}, "
                                                         f"{'true' if fused else 'false'}>")
        combine_kernel = loader.get_kernel("attention.cu", f"attn_combine_kernel<{head_dim}>")
        positions, cos, sin = rope if fused else (None, None, None)
        rope_args = ((positions.data_ptr(), cos.data_ptr(), sin.data_ptr(), np.int32(cos.shape[0]),
                      np.int32(cos.stride(0))) if fused else (0, 0, 0, np.int32(0), np.int32(0)))
        # Row stride of the workspace is its own batch size: index it as [ws_b, ...] (b < batch).
        part_o, part_ml = self.workspace.part_o.data_ptr(), self.workspace.part_ml.data_ptr()
        loader.launch(split_kernel, (splits, hkv, batch), (128,),
                      (q.data_ptr(), self.k_cache.data_ptr(), self.v_cache.data_ptr(), self.seq_lens.data_ptr(),
                       self.slots.data_ptr(), part_o, part_ml, np.int32(hkv), np.int32(max_len), np.int32(num_slots),
                       np.int32(splits), np.int32(self.min_chunk), np.float32(self.scale * LOG2E), np.int32(q_stride))
                      + rope_args)
        loader.launch(combine_kernel, (hq, batch), (COMBINE_PARTS * head_dim,),
                      (part_o, part_ml, self.seq_lens.data_ptr(), self.slots.data_ptr(), self.out.data_ptr(),
                       np.int32(hq), np.int32(max_len), np.int32(num_slots), np.int32(splits),
                       np.int32(self.min_chunk)))
