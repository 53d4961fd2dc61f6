"""Where the quantizer runs: the GPU when PyTorch sees one with room for it, else the CPU.

``qwen-tray quantize``, ``recipe sensitive`` and ``models get`` all take ``--device auto`` (the
default) and resolve it here, so a user with a GPU is not left quantizing on the CPU for an hour
unless they ask for it.
"""

from __future__ import annotations

from pathlib import Path

from app.quant.methods import DEFAULT_METHOD

MiB = 1 << 20
DEVICE_CHOICES = ("auto", "cpu", "cuda")
# Free VRAM the quantizer's clipping search needs on the GPU: the 7B `mixed` peaks at 1.1 GiB
# (issue 31's H100 run); below this it runs on the CPU, beside whatever model the GPU holds.
QUANTIZE_VRAM_BYTES = 1536 * MiB
# gptq's VRAM beside its Hessians: a 271 MB fp32 down_proj chunk of the 7B and the search's buffers.
GPTQ_WORK_VRAM_BYTES = 512 * MiB


def quantize_device(source: Path | None = None, method: str = DEFAULT_METHOD) -> str:
    """The GPU when PyTorch sees one with room for quantizing ``source`` by ``method``, else the CPU."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    free, _total = torch.cuda.mem_get_info()
    return "cuda" if free >= quantize_vram_bytes(source, method) else "cpu"


def resolve_quantize_device(choice: str | None, source: Path | None, method: str) -> str:
    """A ``--device`` value ("auto" or None: :func:`quantize_device`) as "cpu" or "cuda"."""
    return quantize_device(source, method) if choice in (None, "auto") else choice


def quantize_vram_bytes(source: Path | None, method: str) -> int:
    """Free VRAM the quantizer needs: the clipping search's, and for gptq one layer's fp32 Hessians
    besides (q/k/v, o and gate/up of the hidden size, down_proj of the MLP's: 1.6 GB on the 7B)."""
    from app.formats.spec import ModelSpec  # lazily: the commands' --help imports this module

    if method != "gptq" or source is None:
        return QUANTIZE_VRAM_BYTES
    spec = ModelSpec.from_hf_folder(source)
    hessians = 4 * (3 * spec.hidden_size ** 2 + spec.intermediate_size ** 2)
    return max(QUANTIZE_VRAM_BYTES, hessians + GPTQ_WORK_VRAM_BYTES)
