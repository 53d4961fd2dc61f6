"""Qwen Tray's own CUDA kernels (NVRTC through CuPy) and their plain-PyTorch references.

GPU ops (need :func:`available`): :func:`gemv_w4`, :func:`gemv_w3`, :func:`gate_up_silu_w4`,
:func:`gate_up_silu_w3`, :func:`rms_norm`, :func:`rope_kv_write`, :func:`decode_attention`,
:func:`rope_decode_attention` (the last two in one), :func:`argmax_rows` and
:func:`temperature_draw` / :func:`filtered_draw` (the decode step's greedy and sampled tokens).
The references in :mod:`app.kernels.reference` are the CPU path. docs/KERNELS.md explains
the design and why (the measurements behind it: docs/history/). Importing this package never needs a GPU.
"""

from app.kernels.argmax import argmax_rows, argmax_workspace
from app.kernels.attention import DecodeAttentionWorkspace, decode_attention, default_num_splits, rope_decode_attention
from app.kernels.gemv import (
    GemvConfig, GemvOptions, default_gemv_config, gate_up_silu_w3, gate_up_silu_w4, gemv_w3, gemv_w4,
)
from app.kernels.loader import (
    KernelArgumentError,
    KernelCompileError,
    KernelError,
    KernelUnavailableError,
    available,
    unavailable_reason,
)
from app.kernels.norm_rope import rms_norm, rope_kv_write
from app.kernels.token_draw import (
    DrawWorkspace,
    draw_workspace,
    filtered_draw,
    temperature_draw,
)

__all__ = [
    "DecodeAttentionWorkspace", "DrawWorkspace", "GemvConfig", "GemvOptions", "KernelArgumentError",
    "KernelCompileError", "KernelError", "KernelUnavailableError", "argmax_rows", "argmax_workspace", "available",
    "decode_attention", "default_gemv_config", "default_num_splits", "draw_workspace", "filtered_draw",
    "gate_up_silu_w3", "gate_up_silu_w4", "gemv_w3", "gemv_w4", "rms_norm", "rope_decode_attention",
    "rope_kv_write", "temperature_draw", "unavailable_reason",
]
