"""The CPU's int4 backend (app.engine.quantized.cpu_int4) against the float32 dense reference: single
layers (W4 and W3, padded K, bias, rows not a multiple of 16) and a whole checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.engine.kv_cache import StaticKVCache
from app.engine.loading import load_model, load_quantized_model
from app.engine.quantized import cpu_int4
from app.engine.quantized.modules import (
    QuantEmbedding, QuantLinear, default_backend, dense_linear, quantized_nbytes, use_dense_backend, use_int4_backend,
)
from app.formats.recipe import load_recipe
from app.quant.quantizer import QuantizeJob, quantize_model
from app.quant.search import quantize

# bfloat16 activations (8 significant bits) and bfloat16 scales: error relative to the output's size.
LAYER_BOUND = 2e-2


def test_this_pytorch_has_a_working_cpu_int4_kernel():
    """CI's PyTorch must pass the self-check; on one where it fails, CPU loads fall back to dense."""
    assert cpu_int4.available()
    assert default_backend(torch.device("cpu"), torch.bfloat16) == "int4"
    assert default_backend(torch.device("cpu"), torch.float32) == "dense"  # the reference stays exact


@pytest.mark.parametrize("bits,n,k,logical_k,bias", [(4, 37, 256, 256, False), (3, 48, 256, 160, True),
                                                     (4, 4100, 384, 300, True)])
def test_a_quantized_linear_matches_the_float32_reference(bits, n, k, logical_k, bias):
    gen = torch.Generator().manual_seed(bits * 1000 + n)
    w = torch.randn((n, k), generator=gen) * 0.05
    w[:, logical_k:] = 0  # stored K is padded past the logical one with zero columns
    qt = quantize(w, bits, name="layer", method="rtn")
    b = torch.randn(n, generator=gen) if bias else None
    # (a model's bias has the model's dtype: bfloat16 beside the int4 kernel)
    reference, int4 = QuantLinear(qt, logical_k, b), QuantLinear(qt, logical_k, b.bfloat16() if bias else None)
    use_dense_backend(reference, torch.float32)
    use_int4_backend(int4, torch.bfloat16)
    x = torch.randn((5, 2, logical_k), generator=gen)
    want = reference(x)
    got = int4(x.bfloat16())
    assert got.dtype == torch.bfloat16 and got.shape == want.shape == (5, 2, n)
    assert (got.float() - want).abs().max() <= LAYER_BOUND * want.abs().max()
    assert int4.dense_weight is None  # nothing 16-bit is kept


@pytest.fixture(scope="module")
def mixed_checkpoint(tmp_path_factory, tiny_qwen_dir) -> Path:
    out = tmp_path_factory.mktemp("cpu-int4") / "tiny-mixed"
    quantize_model(QuantizeJob(model=tiny_qwen_dir, out=out, recipe=load_recipe("mixed"), method="rtn"))
    return out


def _logits(loaded, ids: torch.Tensor) -> torch.Tensor:
    """Every position's logits [T, V] of one prompt, as float32."""
    cache = StaticKVCache(loaded.spec, 1, loaded.model.max_positions, loaded.dtype, torch.device("cpu"))
    with torch.inference_mode():
        return loaded.model(ids, 0, 0, cache, all_logits=True).float()


def test_a_bfloat16_cpu_load_keeps_4_bits_and_is_as_close_to_the_reference_as_dense_bfloat16(mixed_checkpoint):
    cpu = torch.device("cpu")
    reference = load_model(mixed_checkpoint, cpu, dtype=torch.float32)
    int4 = load_model(mixed_checkpoint, cpu, dtype=torch.bfloat16)  # the default backend: int4
    dense16 = _dense_bf16(mixed_checkpoint)
    quantized = [m for m in int4.model.modules() if isinstance(m, QuantLinear)]
    assert quantized and all(m.backend is cpu_int4.int4_linear and m.dense_weight is None for m in quantized)
    for m in quantized:  # a linear holds only the kernel's copy: 4 bits a weight, a bf16 scale and zero a group
        if not isinstance(m, QuantEmbedding):
            assert set(dict(m.named_buffers(recurse=False))) == {"int4_packed", "int4_scales_zeros"}
            rows = -(-m.out_features // 16) * 16
            assert quantized_nbytes(m) == rows * m.padded_in_features // 2 + rows * m.padded_in_features // 128 * 4
    embedding = int4.model.embed_tokens
    assert isinstance(embedding, QuantEmbedding) and embedding.lookup_backend is cpu_int4.packed_lookup
    ids = torch.tensor([3, 17, 99, 2048, 151000, 5, 5, 42])
    want = _logits(reference, ids)
    err_int4 = (_logits(int4, ids) - want).abs().max()
    err_dense16 = (_logits(dense16, ids) - want).abs().max()
    assert err_int4 <= max(1.5 * err_dense16, 1e-3), (err_int4, err_dense16)
    assert torch.equal(embedding.lookup(ids).float(), reference.model.embed_tokens.lookup(ids).bfloat16().float())


def _dense_bf16(path: Path):
    return load_quantized_model(path, torch.device("cpu"), dtype=torch.bfloat16, backend="dense")


def test_packing_in_row_chunks_equals_packing_the_whole(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    q = torch.randint(-8, 8, (200, 256), generator=gen, dtype=torch.int8)
    scales = (torch.rand((200, 2), generator=gen) + 0.5).half()
    whole = cpu_int4.pack_codes(q, scales, torch.bfloat16)
    monkeypatch.setattr(cpu_int4, "PACK_ROWS", 64)
    chunked = cpu_int4.pack_codes(q, scales, torch.bfloat16)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1], chunked[1])
    assert whole[1].shape == (2, 208, 2)  # rows padded to a multiple of 16 with zero weights
    x = torch.randn((1, 256), generator=gen).bfloat16()
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, whole[0], 128, whole[1])
    assert y.shape == (1, 208) and y[0, 200:].abs().max() == 0
    ref = x.float() @ (q.float() * scales.float().repeat_interleave(128, 1)).T
    assert (y[0, :200].float() - ref[0]).abs().max() <= LAYER_BOUND * ref.abs().max()


def test_the_starter_model_quantized_answers_the_same_through_the_int4_backend(starter_model_dir, tmp_path):
    """A real model (SmolLM2-135M, W4): bfloat16 through the int4 kernel answers like the float32
    dense reference and says the fact it knows."""
    from app.engine import Engine, SamplingParams

    out = tmp_path / "smol-w4"
    quantize_model(QuantizeJob(model=starter_model_dir, out=out, recipe=load_recipe("w4"), method="rtn"))
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    answers = {}
    for dtype in (torch.float32, torch.bfloat16):
        with Engine.load(out, device="cpu", dtype=dtype, max_batch_size=1) as engine:
            backends = {m.backend for m in engine.runner.model.modules() if isinstance(m, QuantLinear)}
            answers[dtype] = engine.chat(question, SamplingParams(max_tokens=12, temperature=0)).result.text
        assert backends == {cpu_int4.int4_linear if dtype == torch.bfloat16 else dense_linear}
    assert "Paris" in answers[torch.bfloat16] and "Paris" in answers[torch.float32]
