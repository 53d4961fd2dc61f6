"""``qwen-tray checkpoint info DIR``: what a quantized checkpoint holds."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("checkpoint", help="inspect quantized checkpoints",
                       description="Inspect quantized checkpoints.")
    csub = p.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    info = csub.add_parser("info", help="print the spec, recipe, bits per weight and size of a checkpoint")
    info.add_argument("path", type=Path, metavar="DIR")
    info.add_argument("--verify", action="store_true", help="also check every file's sha256")
    info.set_defaults(func=run_info)


def run_info(args: argparse.Namespace) -> int:
    from app.formats.checkpoint import open_checkpoint  # lazily: `qwen-tray --help` needs no torch

    manifest = open_checkpoint(args.path, checksum=args.verify, reuse_verified=False)  # --verify: hash every file
    print(describe(args.path, manifest, verified=args.verify))
    return 0


def describe(path: Path, manifest, *, verified: bool = False) -> str:
    spec = manifest.spec
    formats = Counter(t.format for t in manifest.tensors.values())
    params_by_format = Counter()
    for t in manifest.tensors.values():
        n = 1
        for d in t.shape:
            n *= d
        params_by_format[t.format] += n
    file_bytes = sum(f.bytes for f in manifest.files.values())
    adapter = f", LoRA {manifest.adapter} merged" if manifest.adapter else ""
    tensors = ", ".join(f"{fmt}: {formats[fmt]} ({params_by_format[fmt] / 1e6:.1f} M params)" for fmt in sorted(formats))
    checksums = "verified" if verified else "sizes checked (add --verify for sha256)"
    lines = [
        f"checkpoint  {path}",
        (f"model       {manifest.model_id or '?'} ({spec.architecture}), format version {manifest.format_version}, "
         f"created {manifest.created}"),
        (f"spec        {spec.num_layers} layers, hidden {spec.hidden_size}, intermediate {spec.intermediate_size}, "
         f"heads {spec.num_heads}/{spec.num_kv_heads} kv, head_dim {spec.head_dim}, vocab {spec.vocab_size}, "
         f"{'tied' if spec.tie_word_embeddings else 'untied'} embeddings, context {spec.max_position_embeddings}"),
        f"recipe      {manifest.recipe.name} (method {manifest.method}){adapter}",
        f"tensors     {tensors}",
        (f"size        {manifest.total_bytes:,} bytes of weights ({manifest.total_bytes / 2**30:.3f} GiB), "
         f"{file_bytes:,} bytes in {len(manifest.files)} files"),
        (f"bits/weight {manifest.bits_per_weight:.3f} over {manifest.total_params / 1e9:.3f} B params "
         "(scales and fp16 tensors included)"),
        f"checksums   {checksums}",
    ]
    return "\n".join(lines)
