"""How much free VRAM the job wants before it quantizes on the GPU: gptq's Hessians come on top."""

from __future__ import annotations

import json

from app.quant.device import GPTQ_WORK_VRAM_BYTES, QUANTIZE_VRAM_BYTES, quantize_vram_bytes

QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "hidden_size": 3584,
             "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4}


def test_gptq_on_the_7b_wants_room_for_one_layers_hessians(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    hessians = 4 * (3 * 3584 ** 2 + 18944 ** 2)  # fp32: q/k/v, o, gate/up, down_proj's inputs
    assert quantize_vram_bytes(tmp_path, "gptq") == hessians + GPTQ_WORK_VRAM_BYTES
    assert 2.0e9 < quantize_vram_bytes(tmp_path, "gptq") < 2.3e9  # more than the search's 1.5 GiB
    assert quantize_vram_bytes(tmp_path, "calibrated") == QUANTIZE_VRAM_BYTES


def test_a_small_models_gptq_wants_no_less_than_the_search(tiny_qwen_dir):
    assert quantize_vram_bytes(tiny_qwen_dir, "gptq") == QUANTIZE_VRAM_BYTES


def test_every_quantizing_command_defaults_to_auto_which_is_the_cpu_without_a_gpu(tmp_path):
    import torch

    from app.cli import build_parser
    from app.quant.device import resolve_quantize_device

    parser = build_parser()
    for argv in (["quantize", "--model", "m", "--recipe", "w4", "--out", "o"], ["models", "get", "x"],
                 ["recipe", "sensitive", "--model", "m", "--out", "r.json"]):
        assert parser.parse_args(argv).device == "auto", argv
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_7B))
    if not torch.cuda.is_available():
        assert resolve_quantize_device("auto", tmp_path, "gptq") == "cpu"
    assert resolve_quantize_device("cuda", tmp_path, "gptq") == "cuda"  # an explicit choice is kept
    assert resolve_quantize_device("cpu", tmp_path, "gptq") == "cpu"
