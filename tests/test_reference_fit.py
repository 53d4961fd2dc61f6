"""PyTorch's path on a GPU the CUDA kernels cannot use: planned against the VRAM like the kernels'
path, so a dense model too large for the card runs on the CPU ("auto") or is refused ("cuda"),
never a CUDA out-of-memory error halfway through loading."""

from __future__ import annotations

import logging

import pytest
import torch

from app.engine.cuda.memory import GiB, MiB, RTX_3050_LAPTOP, VramBudgetError
from app.engine.cuda.reference_fit import REFERENCE_RUNTIME_BYTES, reference_device, reference_need_bytes
from tests.test_cuda_runtime import QWEN7B, hf_spec

SM75 = "GPU NVIDIA GeForce GTX 1650 has compute capability 7.5; the kernels need 8.0 or newer"
CUDA = torch.device("cuda")  # a device name only: nothing here touches a GPU
SMALL = hf_spec(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                vocab_size=151936, num_hidden_layers=24, tie_word_embeddings=True)  # Qwen2.5-0.5B's shape


def test_the_need_is_the_dense_weights_and_the_cache():
    weights, cache = reference_need_bytes(QWEN7B, num_slots=2, context=4096)
    per_layer = 3584 * (3584 + 2 * 512) + 3584 * 3584 + 3 * 3584 * 18944  # qkv, o, gate/up/down
    assert weights == 2 * (28 * per_layer + 2 * 152064 * 3584)  # fp16; untied embedding and head
    assert cache == 2 * 4096 * 28 * 2 * 4 * 128 * 2  # slots x tokens x layers x (k, v) x kv heads x head_dim x fp16
    weights32, cache32 = reference_need_bytes(QWEN7B, num_slots=2, context=4096, dtype=torch.float32)
    assert (weights32, cache32) == (2 * weights, 2 * cache)


def test_a_7b_too_large_for_a_4_gb_card_runs_on_the_cpu_when_the_device_was_auto(caplog):
    with caplog.at_level(logging.WARNING):
        device = reference_device(QWEN7B, asked="auto", reason=SM75, num_slots=4, context=4096, vram_budget=None,
                                  gpu=RTX_3050_LAPTOP, device=CUDA, label="Qwen2.5-7B-mixed")
    assert device == torch.device("cpu")
    assert "Qwen2.5-7B-mixed needs 15.31 GiB" in caplog.text and "; running on the CPU" in caplog.text
    assert SM75 in caplog.text


def test_a_7b_too_large_for_a_4_gb_card_is_refused_in_one_line_when_cuda_was_asked():
    with pytest.raises(VramBudgetError) as refused:
        reference_device(QWEN7B, asked="cuda", reason=SM75, num_slots=1, context=4096, vram_budget=3 * GiB,
                         gpu=RTX_3050_LAPTOP, device=CUDA, label="Qwen2.5-7B-mixed")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("Qwen2.5-7B-mixed needs 14.65 GiB of VRAM on PyTorch's path")
    assert "(float16 weights 14.18 GiB + KV cache 0.22 GiB (1 x 4096 tokens) + runtime 256 MiB)" in message
    assert "more than the budget of 3.00 GiB" in message
    assert message.endswith(f"cannot run here: {SM75}; fix that, or use --device cpu")


def test_a_small_model_that_fits_stays_on_the_gpu(caplog):
    weights, cache = reference_need_bytes(SMALL, num_slots=1, context=4096)
    assert weights + cache + REFERENCE_RUNTIME_BYTES < 2 * GiB
    with caplog.at_level(logging.WARNING):
        device = reference_device(SMALL, asked="auto", reason=SM75, num_slots=1, context=4096, vram_budget=None,
                                  gpu=RTX_3050_LAPTOP, device=CUDA)
    assert device == CUDA
    assert "with PyTorch on cuda (slower than its kernels)" in caplog.text


@pytest.mark.gpu
def test_engine_load_plans_the_reference_path(tiny_qwen_dir):
    """tiny_qwen_dir (head_dim 16) has no decode-attention kernel: with a 1 MiB budget it does
    not fit, so "auto" loads it on the CPU and "cuda" is refused before anything is loaded."""
    from app.engine import Engine, SamplingParams

    with pytest.raises(VramBudgetError, match="cannot run here: head_dim 16 has no decode-attention kernel"):
        Engine.load(tiny_qwen_dir, device="cuda", max_batch_size=1, vram_budget=1 * MiB)
    with Engine.load(tiny_qwen_dir, device="auto", max_batch_size=1, vram_budget=1 * MiB) as engine:
        out = engine.generate([5, 6, 7], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)).result
        assert engine.device == "cpu"
        assert engine.kernels_unavailable == "head_dim 16 has no decode-attention kernel (only 64 and 128)"
    assert len(out.token_ids) == 3


def test_a_cpu_load_is_not_a_load_without_the_kernels(tiny_qwen_dir):
    """kernels_unavailable (the tray's notice) is for a GPU machine only: the CPU by choice says nothing."""
    from app.engine import Engine

    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1) as engine:
        assert engine.device == "cpu" and engine.kernels_unavailable is None
