"""ModelSpec from HF configs and weight loading: shards, dtypes, missing/leftover tensors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from app.engine.loading import load_model
from app.errors import ModelLoadError, UnsupportedModelError
from app.formats.spec import ModelSpec

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 152064, "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
LLAMA32_1B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256,
    "eos_token_id": [128001, 128008, 128009], "bos_token_id": 128000,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}


def test_qwen25_7b_spec():
    spec = ModelSpec.from_hf_config(QWEN25_7B, {"eos_token_id": [151645, 151643]})
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (28, 4, 128)
    assert spec.attention_bias and not spec.tie_word_embeddings
    assert spec.eos_token_ids == (151645, 151643)
    assert spec.q_size == 3584 and spec.kv_size == 512


def test_llama32_spec_with_llama3_rope_and_several_eos():
    spec = ModelSpec.from_hf_config(LLAMA32_1B)
    assert spec.rope_scaling.kind == "llama3" and spec.rope_scaling.factor == 32.0
    assert spec.eos_token_ids == (128001, 128008, 128009) and spec.tie_word_embeddings
    assert not spec.attention_bias
    assert ModelSpec.from_dict(spec.to_dict()) == spec


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(UnsupportedModelError, match="Qwen2ForCausalLM, LlamaForCausalLM"):
        ModelSpec.from_hf_config({**QWEN25_7B, "architectures": ["MistralForCausalLM"]})


def test_unsupported_rope_scaling_is_refused():
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelSpec.from_hf_config({**QWEN25_7B, "rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_missing_field_names_it():
    config = dict(QWEN25_7B)
    del config["hidden_size"]
    with pytest.raises(ModelLoadError, match="hidden_size"):
        ModelSpec.from_hf_config(config)


def test_bad_head_ratio():
    with pytest.raises(UnsupportedModelError, match="multiple"):
        ModelSpec.from_hf_config({**QWEN25_7B, "num_key_value_heads": 5})


def _logits(folder, ids, dtype=torch.float32):
    loaded = load_model(folder, torch.device("cpu"), dtype=dtype, max_context=64)
    from app.engine.kv_cache import StaticKVCache

    cache = StaticKVCache(loaded.spec, 1, 64, dtype, "cpu")
    with torch.inference_mode():
        return loaded.model(torch.tensor(ids), 0, 0, cache, all_logits=True)


def test_sharded_checkpoint_loads_like_a_single_file(tmp_path, tiny_qwen_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=torch.float32)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="5MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen_dir / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file()
    ids = [5, 100, 2000, 30000, 7]
    assert torch.equal(_logits(sharded, ids), _logits(tiny_qwen_dir, ids))
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    first_shard = sorted(set(index["weight_map"].values()))[0]
    (sharded / first_shard).unlink()
    with pytest.raises(ModelLoadError, match=first_shard):
        load_model(sharded, torch.device("cpu"))


@pytest.mark.parametrize("source_dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sources(tmp_path, tiny_qwen_dir, source_dtype):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, dtype=source_dtype)
    folder = tmp_path / str(source_dtype)
    hf.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen_dir / name, folder / name)
    ids = [5, 100, 2000, 30000, 7]
    with torch.no_grad():
        ref = hf.float()(torch.tensor([ids])).logits[0]
    assert (_logits(folder, ids) - ref).abs().max() < 2e-4  # same rounded weights, fp32 math


def test_missing_and_leftover_tensors_are_named(tmp_path, tiny_qwen_dir):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "edited"
    shutil.copytree(tiny_qwen_dir, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"missing tensors model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(folder, torch.device("cpu"))
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(160, 64)
    tensors["model.layers.9.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"unexpected tensors model\.layers\.9\.extra\.weight"):
        load_model(folder, torch.device("cpu"))


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, tiny_qwen_dir):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "wrongshape"
    shutil.copytree(tiny_qwen_dir, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(64, 32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"o_proj\.weight.*\(64, 32\).*\(64, 64\)"):
        load_model(folder, torch.device("cpu"))
