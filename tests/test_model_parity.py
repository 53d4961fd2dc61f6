"""Our reference forward pass against transformers on tiny random models (fp32).

Several configs cover both architectures, GQA ratios, tied/untied embeddings, Qwen's q/k/v
bias, Llama-3 rope scaling, an explicit head_dim and a merged LoRA adapter. Bound: max abs
logit error 2e-4 over prefill and 24 decode steps (observed ~1e-5; logits are O(1)).
"""

from __future__ import annotations

import pytest
import torch

from app.engine import Engine, SamplingParams
from tests.conftest import build_tiny_model

MAX_ABS_ERR = 2e-4
DECODE_STEPS = 24

CONFIGS = {
    "qwen2-gqa4x2-untied": ("qwen2", {}),
    "qwen2-mha-tied": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True, seed=1)),
    "llama-gqa4x1-llama3rope": ("llama", dict(num_key_value_heads=1, seed=2, max_position_embeddings=2048, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})),
    "llama-9x3-headdim16-tied": ("llama", dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3,
                                               head_dim=16, tie_word_embeddings=True, rope_theta=100000.0, seed=3)),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny_model(request, tmp_path_factory, qwen_tokenizer_dir):
    arch, overrides = CONFIGS[request.param]
    return build_tiny_model(tmp_path_factory.mktemp(request.param), qwen_tokenizer_dir, arch, **overrides)


def _hf(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _random_ids(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 150000, (n,), generator=g).tolist()


def test_prefill_and_decode_logits_match_transformers(tiny_model):
    hf = _hf(tiny_model)
    prompt = _random_ids(37, seed=11)
    continuation = _random_ids(DECODE_STEPS, seed=12)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + continuation])).logits[0]  # [T, V]
    with Engine.load(tiny_model, device="cpu", max_batch_size=2, max_context=128) as engine:
        runner = engine.runner
        slot = 1  # not slot 0: slots must be independent
        got = [runner.all_logits(slot, prompt)]
        for i, tok in enumerate(continuation):
            got.append(runner.decode([slot], [tok], [len(prompt) + i]))
        ours = torch.cat(got)
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max().item()
    assert err < MAX_ABS_ERR, f"max abs logit error {err}"


def test_greedy_generation_equals_transformers_generate(tiny_model):
    hf = _hf(tiny_model)
    with Engine.load(tiny_model, device="cpu", max_batch_size=1, max_context=256) as engine:
        prompt = engine.tokenizer.encode_chat([{"role": "system", "content": "You are terse."},
                                               {"role": "user", "content": "Name three colours."}])
        gen = engine.generate(prompt, SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
        ours = list(gen.wait(60).token_ids)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=None,
                          pad_token_id=0, min_new_tokens=30)
    assert ours == out[0, len(prompt):].tolist()


def test_lora_adapter_merged_matches_peft(tmp_path, tiny_qwen_dir):
    peft = pytest.importorskip("peft")
    hf = _hf(tiny_qwen_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=True)
    model = peft.get_peft_model(hf, config)
    torch.manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft initialises B to zero: make the adapter do something
                p.normal_(0, 0.2)
    model.save_pretrained(tmp_path / "adapter")
    ids = _random_ids(20, seed=3)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1, max_context=64, adapter=tmp_path / "adapter") as engine:
        ours = engine.runner.all_logits(0, ids)
    assert (ours - ref).abs().max().item() < MAX_ABS_ERR
    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1, max_context=64) as plain:
        assert (plain.runner.all_logits(0, ids) - ref).abs().max().item() > 1e-2, "adapter had no effect"
