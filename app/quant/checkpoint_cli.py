"""``qwen-tray checkpoint info NAME|DIR``: what a quantized checkpoint holds; ``checkpoint eval``: how good it is.

Both take a registered model's name wherever they take a folder, as ``quantize --model`` does
(app.settings.console.locate_model): `models list` shows a checkpoint by its name."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("checkpoint", help="inspect quantized checkpoints",
                       description="Inspect quantized checkpoints.")
    csub = p.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    info = csub.add_parser("info", help="print the spec, recipe, bits per weight and size of a checkpoint")
    info.add_argument("path", metavar="NAME|DIR", help="a registered model's name or a checkpoint folder")
    info.add_argument("--verify", action="store_true", help="also check every file's sha256")
    info.set_defaults(func=run_info)
    ev = csub.add_parser(
        "eval", help="perplexity of a checkpoint (and its source) on the held-out texts shipped with the app",
        description="Score a checkpoint on the English and Chinese held-out texts shipped with the app (never "
                    "the calibration text), in non-overlapping windows of 512 tokens; with --source, score the "
                    "model it was made from the same way. Lower is better.")
    ev.add_argument("path", metavar="NAME|CKPT", help="a registered model's name or a checkpoint folder (or any "
                    "model folder)")
    ev.add_argument("--source", metavar="NAME|HF_DIR", help="the model it was quantized from: a registered name or "
                    "a Hugging Face folder")
    ev.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where to run it (default: cuda when available, else cpu)")
    ev.add_argument("--tokens", type=int, metavar="N", help="score only the first N tokens of each text")
    ev.set_defaults(func=run_eval)


def run_info(args: argparse.Namespace) -> int:
    from app.formats.checkpoint import open_checkpoint  # lazily: `qwen-tray --help` needs no torch

    path = _located(args.path)
    manifest = open_checkpoint(path, checksum=args.verify, reuse_verified=False)  # --verify: hash every file
    name = args.path if Path(args.path).expanduser() != path else None  # the registered name it was given by
    print(describe(path, manifest, verified=args.verify, name=name))
    return 0


def _located(name_or_path: str) -> Path:
    """The folder of a registered model's name, or the folder given (a missing one is named as
    `quantize --model` names it)."""
    from app.settings.console import locate_model

    return locate_model(name_or_path).path


def describe(path: Path, manifest, *, verified: bool = False, name: str | None = None) -> str:
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
        f"checkpoint  {path}" + (f" ({name})" if name else ""),
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


def run_eval(args: argparse.Namespace) -> int:
    import torch

    from app.errors import ModelLoadError, QwenTrayError
    from app.quant.heldout import score_folder

    if args.tokens is not None and args.tokens < 2:
        raise QwenTrayError(f"--tokens must be at least 2, got {args.tokens}")
    given = [("checkpoint", args.path)] + ([("source", args.source)] if args.source else [])
    folders = [(label, _located(text)) for label, text in given]
    for label, folder in folders:
        if not folder.is_dir():  # (a file: the path is there, but it is not a model)
            raise ModelLoadError(f"{folder}: {label} folder not found")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    scores = [(label, folder, score_folder(folder, device, max_tokens=args.tokens)) for label, folder in folders]
    print(format_scores(scores))
    return 0


def format_scores(scores) -> str:
    """One line per model: perplexity per held-out text and overall (and vs the source)."""
    source = next((s for label, _, s in scores if label == "source"), None)
    lines = []
    for label, folder, score in scores:
        texts = "  ".join(f"{lang} {ppl:.3f} ({score.tokens[lang]} tokens)" for lang, ppl in score.perplexity.items())
        line = f"{label:10} {folder}: perplexity {score.overall:.3f}  [{texts}]"
        if source is not None and label != "source":
            line += f"  {score.overall / source.overall - 1:+.1%} vs source"
        lines.append(line)
    return "\n".join(lines)
