"""W4 / W3 layouts pinned bit by bit, quantization bounds, QuantizedTensor, recipes.

The naive references below are written from the layout text in docs/FORMATS.md (position of
each k inside the words), independently of app.formats' packing code (words -> k).
"""

from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pytest
import torch

from app.errors import QwenTrayError
from app.formats.core import quantized_nbytes
from app.formats.tensor import QuantizedTensor
from app.formats.w3 import dequantize_w3, embedding_lookup_w3_ref, pack_w3, quantize_w3, unpack_w3, w3_matmul_ref
from app.formats.w4 import dequantize_w4, embedding_lookup_ref, pack_w4, quantize_w4, unpack_w4, w4_matmul_ref
from app.quant.search import quantize

ROWS = (1, 3, 37, 257)
COLS = (128, 384, 1152)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "FORMATS.md"


def _random_q(n: int, k: int, lo: int, hi: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, (n, k), generator=g, dtype=torch.int8)


def _random_scales(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand((n, k // 128), generator=g) * 0.1 + 1e-3).half()


def _u32(words: torch.Tensor) -> np.ndarray:
    return words.numpy().view(np.uint32)


# -- naive per-element readers of the documented layouts (numpy, k -> bit position) --------

def naive_w4_values(qweight: torch.Tensor, k_total: int) -> np.ndarray:
    words = _u32(qweight)
    perm4 = [0, 2, 4, 6, 1, 3, 5, 7]
    out = np.zeros((words.shape[0], k_total), dtype=np.int64)
    for k in range(k_total):
        j, offset = divmod(k, 8)
        nibble = perm4.index(offset)  # nibble i holds k = 8j + perm4[i]
        out[:, k] = ((words[:, j] >> np.uint32(4 * nibble)) & np.uint32(0xF)).astype(np.int64) - 8
    return out


def naive_w3_values(qlow: torch.Tensor, qhigh: torch.Tensor, k_total: int) -> np.ndarray:
    low, high = _u32(qlow), _u32(qhigh)
    out = np.zeros((low.shape[0], k_total), dtype=np.int64)
    for k in range(k_total):
        j, r = divmod(k, 16)  # bits 2i.. hold k = 16j+2i, bits 16+2i.. hold k = 16j+2i+1
        low_bit = 2 * (r // 2) + (16 if r % 2 else 0)
        jh, rh = divmod(k, 32)  # bit i holds k = 32j+2i, bit 16+i holds k = 32j+2i+1
        high_bit = rh // 2 + (16 if rh % 2 else 0)
        lo = (low[:, j] >> np.uint32(low_bit)) & np.uint32(3)
        hi = (high[:, jh] >> np.uint32(high_bit)) & np.uint32(1)
        out[:, k] = (lo | (hi << np.uint32(2))).astype(np.int64) - 4
    return out


def naive_dequantize(values: np.ndarray, scales: torch.Tensor) -> np.ndarray:
    s = scales.float().numpy()
    out = np.zeros(values.shape, dtype=np.float32)
    for k in range(values.shape[1]):
        out[:, k] = values[:, k].astype(np.float32) * s[:, k // 128]
    return out


# -- pack / unpack ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("k", COLS)
def test_pack_unpack_roundtrip_is_exact(n, k):
    q4 = _random_q(n, k, -8, 7, seed=n * k)
    qweight = pack_w4(q4)
    assert qweight.dtype == torch.int32 and qweight.shape == (n, k // 8)
    assert torch.equal(unpack_w4(qweight), q4)
    q3 = _random_q(n, k, -4, 3, seed=n * k + 1)
    qlow, qhigh = pack_w3(q3)
    assert qlow.dtype == qhigh.dtype == torch.int32
    assert qlow.shape == (n, k // 16) and qhigh.shape == (n, k // 32)
    assert torch.equal(unpack_w3(qlow, qhigh), q3)


@pytest.mark.parametrize("n,k", [(3, 384), (37, 128), (1, 1152)])
def test_dequantize_matches_naive_layout_reader(n, k):
    scales = _random_scales(n, k, seed=7)
    q4 = _random_q(n, k, -8, 7, seed=1)
    qweight = pack_w4(q4)
    assert np.array_equal(naive_w4_values(qweight, k), q4.numpy())
    expected = naive_dequantize(naive_w4_values(qweight, k), scales)
    assert np.array_equal(dequantize_w4(qweight, scales).numpy(), expected)
    q3 = _random_q(n, k, -4, 3, seed=2)
    qlow, qhigh = pack_w3(q3)
    assert np.array_equal(naive_w3_values(qlow, qhigh, k), q3.numpy())
    expected = naive_dequantize(naive_w3_values(qlow, qhigh, k), scales)
    assert np.array_equal(dequantize_w3(qlow, qhigh, scales).numpy(), expected)


def _magic_half2(words: np.ndarray, offset: int) -> np.ndarray:
    """OR 0x6400 into each half-word and read the pair as fp16, minus 1024 + offset."""
    halves = (words | np.uint32(0x64006400)).astype("<u4").view("<f2").reshape(*words.shape, 2)
    return halves.astype(np.float32) - (1024 + offset)


def test_magic_number_decode_yields_documented_pairs():
    n, k = 5, 256
    q4 = _random_q(n, k, -8, 7, seed=3)
    words = _u32(pack_w4(q4))
    for j in range(k // 8):
        for i in range(4):
            pair = _magic_half2((words[:, j] >> np.uint32(4 * i)) & np.uint32(0x000F000F), 8)
            assert np.array_equal(pair, q4[:, 8 * j + 2 * i: 8 * j + 2 * i + 2].float().numpy())
    q3 = _random_q(n, k, -4, 3, seed=4)
    qlow, qhigh = (_u32(t) for t in pack_w3(q3))
    for j in range(k // 16):
        for i in range(8):
            lo = (qlow[:, j] >> np.uint32(2 * i)) & np.uint32(0x00030003)
            # k = 16j + 2i lives in qhigh word j // 2 at pair index 8 * (j % 2) + i
            hi = ((qhigh[:, j // 2] >> np.uint32(8 * (j % 2) + i)) & np.uint32(0x00010001)) << np.uint32(2)
            pair = _magic_half2(lo | hi, 4)
            assert np.array_equal(pair, q3[:, 16 * j + 2 * i: 16 * j + 2 * i + 2].float().numpy())


def test_worked_example_in_docs_matches_the_packer():
    q4 = torch.tensor([[3, -1, 0, 7, -8, 2, -5, 1, 6, -2, -4, 4, -7, 5, -3, -6]])
    assert [int(w) & 0xFFFFFFFF for w in pack_w4(q4)[0]] == [0x9AF7308B, 0x2DC6514E]
    q3 = torch.tensor([[3, -1, 0, -4, 2, -2, 1, -3, -4, 3, 0, 1, -1, 2, -3, 0] + [0] * 16])
    qlow, qhigh = pack_w3(q3)
    assert int(qlow[0, 0]) & 0xFFFFFFFF == 0x27637063
    assert int(qhigh[0, 0]) & 0x00FF00FF == 0x00F0002F
    doc = DOCS.read_text(encoding="utf-8")
    for word in ("0x9AF7308B", "0x2DC6514E", "0x27637063", "0x00F0002F"):
        assert word in doc, f"docs/FORMATS.md lost the worked example word {word}"


# -- quantization ----------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 3])
def test_rtn_error_is_at_most_half_a_step(bits):
    g = torch.Generator().manual_seed(5)
    w = torch.randn((37, 384), generator=g) * torch.rand((37, 1), generator=g) * 3
    qt = quantize(w, bits, method="rtn")
    step = qt.tensors["scales"].float().repeat_interleave(128, dim=1)
    err = (qt.dequantize() - w).abs()
    assert bool((err <= step / 2 * (1 + 1e-6)).all())
    # round-to-nearest uses the full signed range: some group reaches qmin or qmax
    q = unpack_w4(qt.tensors["qweight"]) if bits == 4 else unpack_w3(qt.tensors["qlow"], qt.tensors["qhigh"])
    assert int(q.min()) == -(1 << (bits - 1)) and int(q.max()) == (1 << (bits - 1)) - 1


def test_given_scales_clip_only_outside_the_range():
    g = torch.Generator().manual_seed(6)
    w = torch.randn((8, 256), generator=g)
    scales = torch.full((8, 2), 0.1, dtype=torch.float16)
    qweight, out_scales = quantize_w4(w, scales)
    assert torch.equal(out_scales, scales)
    s = float(scales[0, 0])
    err = (dequantize_w4(qweight, out_scales) - w).abs()
    inside = (w / s >= -8.5) & (w / s <= 7.5)
    assert bool((err[inside] <= s / 2 + 1e-7).all())
    assert bool(torch.equal(dequantize_w4(qweight, out_scales)[~inside].abs(),
                            torch.where(w[~inside] > 0, 7 * s, 8 * s).float()))


def test_zero_and_half_precision_weights_quantize():
    w = torch.zeros((2, 128), dtype=torch.bfloat16)
    qweight, scales = quantize_w4(w)
    assert bool((scales > 0).all()) and torch.equal(dequantize_w4(qweight, scales), torch.zeros(2, 128))
    w16 = torch.randn(4, 256).half()
    qlow, qhigh, s3 = quantize_w3(w16)
    assert dequantize_w3(qlow, qhigh, s3, torch.float16).dtype == torch.float16


@pytest.mark.parametrize("k", [100, 200, 1000])
def test_k_not_multiple_of_128_is_a_clear_error(k):
    w = torch.randn(4, k)
    for fn in (quantize_w4, quantize_w3):
        with pytest.raises(QwenTrayError, match=rf"model\.layers\.0\.mlp\.down_proj.*K={k}"):
            fn(w, name="model.layers.0.mlp.down_proj")


def test_non_finite_weights_are_rejected():
    w = torch.randn(2, 128)
    w[1, 5] = float("nan")
    with pytest.raises(QwenTrayError, match="lm_head.*NaN"):
        quantize(w, 4, name="lm_head")


def test_matmul_and_embedding_references():
    g = torch.Generator().manual_seed(8)
    w = torch.randn((48, 256), generator=g)
    x = torch.randn((2, 3, 256), generator=g).half()
    ids = torch.tensor([[0, 47, 5], [5, 5, 12]])
    for bits in (4, 3):
        qt = quantize(w, bits)
        dense = qt.dequantize()
        assert torch.allclose(qt.matmul_ref(x), x.float() @ dense.T, atol=1e-4, rtol=1e-5)
        assert torch.equal(qt.lookup_rows(ids), dense[ids])
    t = quantize(w, 4).tensors
    assert torch.equal(embedding_lookup_ref(ids, t["qweight"], t["scales"]), dequantize_w4(t["qweight"], t["scales"])[ids])
    assert w4_matmul_ref(x, t["qweight"], t["scales"]).shape == (2, 3, 48)
    t = quantize(w, 3).tensors
    assert torch.equal(embedding_lookup_w3_ref(ids, t["qlow"], t["qhigh"], t["scales"]),
                       dequantize_w3(t["qlow"], t["qhigh"], t["scales"])[ids])
    assert w3_matmul_ref(x, t["qlow"], t["qhigh"], t["scales"]).shape == (2, 3, 48)


def test_quantized_tensor_bytes_state_dict_and_validation():
    w = torch.randn(40, 384)
    for bits, fmt in ((4, "w4"), (3, "w3")):
        qt = quantize(w, bits, name="model.layers.0.mlp.up_proj", method="rtn")
        assert qt.format == fmt and qt.bits == bits and qt.shape == (40, 384)
        assert qt.nbytes == quantized_nbytes(40, 384, bits) == 40 * 384 * bits // 8 + 40 * 3 * 2
        assert qt.bits_per_weight == pytest.approx(bits + 16 / 128)
        sd = qt.state_dict("model.layers.0.mlp.up_proj")
        back = QuantizedTensor.from_state_dict("model.layers.0.mlp.up_proj", sd)
        assert back.format == fmt and back.shape == qt.shape
        assert torch.equal(back.dequantize(), qt.dequantize())
    bad = dict(quantize(w, 4).tensors)
    bad["qweight"] = bad["qweight"][:, :-1]
    with pytest.raises(QwenTrayError, match=r"lm_head\.qweight"):
        QuantizedTensor("w4", (40, 384), bad, name="lm_head")
    with pytest.raises(QwenTrayError, match="lacks qhigh"):
        QuantizedTensor.from_state_dict("x", {"x.qlow": torch.zeros(1, 8, dtype=torch.int32),
                                              "x.scales": torch.ones(1, 1, dtype=torch.float16)})


def test_chunked_quantization_equals_one_shot():
    w = torch.randn(37, 384)
    a = quantize_w4(w)
    b = quantize_w4(w, chunk_elements=384 * 5)  # 5 rows per chunk, last chunk partial
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    c, d = quantize_w3(w), quantize_w3(w, chunk_elements=1)
    assert all(torch.equal(x, y) for x, y in zip(c, d))



# -- recipes: bits per tensor, bytes, bits per weight -----------------------------------------

# Qwen2.5 configs (config.json of Qwen/Qwen2.5-7B-Instruct and Qwen/Qwen2.5-3B-Instruct).
QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)
QWEN25_3B = dict(model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                 num_attention_heads=16, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


def _hand_bytes(cfg: dict, attn_bits: int, mlp_bits: int, embed_bits: int, head_bits: int) -> int:
    """Byte count written out by hand: b-bit weights cost b/8 + 2/128 bytes each (fp16 scale per 128)."""
    h, i, layers, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]

    def q(n_weights, bits):
        return n_weights * bits // 8 + n_weights // 128 * 2

    attn = q(2 * h * h + 2 * kv * h, attn_bits)
    mlp = q(3 * h * i, mlp_bits)
    fp16 = 2 * (h + 2 * kv) + 2 * 2 * h  # q/k/v biases, two norms per layer
    total = layers * (attn + mlp + fp16) + q(v * h, embed_bits) + 2 * h  # + final norm
    if not cfg["tie_word_embeddings"]:
        total += q(v * h, head_bits)
    return total


def test_qwen25_7b_mixed_fits_the_4gb_budget():
    from app.formats.recipe import hf_tensor_shapes, load_recipe, plan_model

    plan = plan_model(load_recipe("mixed"), hf_tensor_shapes(QWEN25_7B))
    assert plan.total_bytes == _hand_bytes(QWEN25_7B, 4, 3, 3, 4) == 3_146_271_744
    assert plan.gib == pytest.approx(2.930, abs=0.001)
    assert plan.bits_per_weight == pytest.approx(3.305, abs=0.001)
    assert plan.total_params == 7_615_616_512
    bits = {t.name: t.bits for t in plan.tensors}
    assert bits["model.layers.3.self_attn.k_proj.weight"] == 4
    assert bits["model.layers.27.mlp.down_proj.weight"] == 3
    # the head at 4 bits (issue 36), the untied embedding at 3: the same size as before
    assert bits["model.embed_tokens.weight"] == 3 and bits["lm_head.weight"] == 4
    assert bits["model.layers.0.self_attn.q_proj.bias"] == 16 and bits["model.norm.weight"] == 16


def test_qwen25_3b_w4_and_q4_agree():
    from app.formats.recipe import hf_tensor_shapes, load_recipe, plan_model

    shapes = hf_tensor_shapes(QWEN25_3B)
    assert not any(name.startswith("lm_head") for name, _ in shapes)  # tied: one table serves both
    plan = plan_model(load_recipe("w4"), shapes)
    assert plan.total_bytes == _hand_bytes(QWEN25_3B, 4, 4, 4, 4) == 1_591_545_856
    assert plan.gib == pytest.approx(1.482, abs=0.001)
    assert plan.total_params == 3_085_938_688
    assert plan_model(load_recipe("q4"), shapes).total_bytes == plan.total_bytes


def test_shapes_from_config_match_transformers_models():
    transformers = pytest.importorskip("transformers")
    for cfg, cls_name, conf_name in ((QWEN25_7B, "Qwen2ForCausalLM", "Qwen2Config"),
                                     (QWEN25_3B, "Qwen2ForCausalLM", "Qwen2Config"),
                                     (dict(QWEN25_3B, model_type="llama", attention_bias=False),
                                      "LlamaForCausalLM", "LlamaConfig")):
        hf_cfg = getattr(transformers, conf_name)(**{k: v for k, v in cfg.items() if k != "model_type"})
        with torch.device("meta"):
            model = getattr(transformers, cls_name)(hf_cfg)
        real = [(name, tuple(p.shape)) for name, p in model.named_parameters()]  # tied lm_head dropped
        from app.formats.recipe import hf_tensor_shapes

        assert sorted(hf_tensor_shapes(cfg)) == sorted(real)


def _has_toml_parser() -> bool:
    import importlib.util

    return any(importlib.util.find_spec(m) is not None for m in ("tomllib", "tomli"))


def test_load_recipe_from_json(tmp_path):
    from app.formats.recipe import load_recipe

    json_file = tmp_path / "all3.json"
    json_file.write_text('{"default_bits": 3, "bits": {"lm_head": 4}}', encoding="utf-8")
    r = load_recipe(json_file)
    assert r.name == "all3" and r.bits_for("lm_head") == 4 and r.bits_for("model.layers.1.mlp.up_proj") == 3


def test_load_recipe_from_toml(tmp_path):
    from app.formats.recipe import load_recipe

    toml_file = tmp_path / "mine.toml"
    toml_file.write_text('name = "mine"\nbase = "mixed"\n[bits]\n"model.layers.*.mlp.down_proj" = 4\n'
                         '"model.layers.0.*" = 16\n', encoding="utf-8")
    if not _has_toml_parser():  # Python 3.10 without tomli: a clear error, not a crash
        with pytest.raises(QwenTrayError, match=r"mine\.toml: TOML recipes need Python 3\.11"):
            load_recipe(toml_file)
        return
    r = load_recipe(str(toml_file))
    assert r.name == "mine"
    assert r.bits_for("model.layers.5.mlp.down_proj") == 4  # own rule before the base's
    assert r.bits_for("model.layers.5.mlp.up_proj") == 3  # from base "mixed"
    assert r.bits_for("model.layers.0.self_attn.q_proj") == 16
    assert r.bits_for("model.something_else") == 16  # default


@pytest.mark.parametrize("text,match", [
    ('{"bits": {"lm_head": 5}}', r"bad\.json: bits\.'lm_head'.*3, 4, 16"),
    ('{"bitz": {}}', r"bad\.json: unknown recipe field.*bitz"),
    ('{"base": "w5"}', r"bad\.json: base 'w5'"),
    ('{"bits": ', r"bad\.json: invalid JSON"),
    ('{}', r"bad\.json: the recipe quantizes nothing \(every weight stays at 16 bits\); give it a base \(w4, mixed, "
           r"q4\), a \[bits\] table or default_bits = 4 or 3"),
    ('{"bits": {"lm_head": 16}}', r"bad\.json: the recipe quantizes nothing"),
])
def test_bad_recipe_files_name_the_field(tmp_path, text, match):
    from app.formats.recipe import load_recipe

    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(QwenTrayError, match=match):
        load_recipe(path)


def test_quantize_with_an_empty_recipe_file_is_refused_in_one_line(cli, tmp_path, tiny_qwen_dir):
    from tests.conftest import assert_one_line_error

    empty = tmp_path / "r4.toml"
    empty.write_text("", encoding="utf-8")
    proc = cli("quantize", "--model", str(tiny_qwen_dir), "--recipe", str(empty), "--out", str(tmp_path / "q"))
    assert_one_line_error(proc, f"{empty}: the recipe quantizes nothing")
    assert not (tmp_path / "q").exists()


def test_unknown_recipe_and_k_rule_in_plans():
    from app.formats.recipe import load_recipe, plan_model

    with pytest.raises(QwenTrayError, match="not a built-in recipe"):
        load_recipe("w5")
    # K=576 (SmolLM2-135M's hidden size) is planned as the quantizer stores it: padded to 640
    plan = plan_model(load_recipe("w4"), [("model.embed_tokens.weight", (49152, 576))])
    assert plan.total_bytes == 49152 * 640 // 2 + 49152 * 5 * 2


def test_the_plan_is_what_the_quantizer_writes_when_k_is_padded(tiny_qwen_dir, tmp_path):
    """hidden_size 64: every weight's K is padded to 128; planning must not refuse what quantize does."""
    from safetensors import safe_open

    from app.formats.recipe import hf_tensor_shapes, load_recipe, plan_model
    from app.quant.quantizer import QuantizeJob, quantize_model

    config = json.loads((tiny_qwen_dir / "config.json").read_text())
    plan = plan_model(load_recipe("w4"), hf_tensor_shapes(config))
    out = tmp_path / "ckpt"
    quantize_model(QuantizeJob(model=tiny_qwen_dir, out=out, recipe=load_recipe("w4"), method="rtn"))
    stored = 0
    for path in out.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            stored += sum(f.get_tensor(k).nbytes for k in f.keys())  # noqa: SIM118 - safe_open is not a dict
    assert plan.total_bytes == stored


def test_packing_a_tensor_taller_than_one_chunk_equals_packing_its_rows_alone():
    # the packers widen to int64 a chunk of rows at a time (a 7B gate/up would need ~3 GB at once)
    from app.formats.core import DEFAULT_CHUNK_ELEMENTS, pack_fields

    n, k = 2 * DEFAULT_CHUNK_ELEMENTS // 640 + 3, 640
    q4 = torch.randint(-8, 8, (n, k), dtype=torch.int8)
    q3 = torch.randint(-4, 4, (n, k), dtype=torch.int8)
    rows = [pack_fields(q4[i:i + 1].to(torch.int32) + 8, width=4) for i in (0, n // 2, n - 1)]
    assert torch.equal(pack_w4(q4)[[0, n // 2, n - 1]], torch.cat(rows))
    assert torch.equal(unpack_w4(pack_w4(q4)), q4) and torch.equal(unpack_w3(*pack_w3(q3)), q3)
    low, high = pack_w3(q3)
    assert torch.equal(low[-1:], pack_w3(q3[-1:])[0]) and torch.equal(high[:1], pack_w3(q3[:1])[1])
