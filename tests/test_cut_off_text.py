"""An answer cut off by its token limit in the middle of a character (finish_reason "length")
ends without that half character: never "\ufffd", neither streamed nor in the result.

The CPU engine runs a tiny Qwen2 model whose weights make greedy decoding follow a fixed
chain of Qwen's real tokens (attention and MLP outputs zeroed, so each step's logits depend
only on the current token): 猫 → 你好 → 世界 → the first half of 龘 → its second half → <|im_end|>.
"""

from __future__ import annotations

import pytest
import torch

from app.engine import Engine, SamplingParams
from app.engine.tokenizer import Tokenizer
from tests.conftest import build_tiny_model

PROMPT, CHAIN_TEXT, SPLIT_CHAR = "猫", ["你好", "世界"], "龘"


def _chain_ids(tokenizer: Tokenizer) -> list[int]:
    split = tokenizer.encode(SPLIT_CHAR)
    assert len(split) == 2 and tokenizer.decode(split[:1]).endswith("\ufffd"), "龘 must span two tokens"
    chain = tokenizer.encode(PROMPT) + [i for t in CHAIN_TEXT for i in tokenizer.encode(t)] + split
    assert len(chain) == 5, chain
    return chain + [tokenizer.token_id("<|im_end|>")]


@pytest.fixture(scope="module")
def chain_engine(tmp_path_factory, qwen_tokenizer_dir):
    from transformers import Qwen2ForCausalLM

    folder = build_tiny_model(tmp_path_factory.mktemp("chain-qwen2"), qwen_tokenizer_dir, "qwen2")
    tokenizer = Tokenizer.from_folder(folder)
    chain = _chain_ids(tokenizer)
    model = Qwen2ForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the current token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.norm.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        for k, (current, following) in enumerate(zip(chain, chain[1:], strict=False)):
            model.model.embed_tokens.weight[current, k] = 1.0  # token k of the chain: hidden direction k
            model.lm_head.weight[following, k] = 10.0  # direction k: the next token of the chain wins
    model.save_pretrained(folder, safe_serialization=True)
    with Engine.load(folder, device="cpu", max_batch_size=1, max_context=64) as engine:
        yield engine, chain


def _run(engine: Engine, prompt: list[int], max_tokens: int):
    stream = engine.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))
    deltas = list(stream)
    return deltas, stream.result


def test_a_length_stop_in_the_middle_of_a_character_drops_the_half_character(chain_engine):
    engine, chain = chain_engine
    deltas, result = _run(engine, chain[:1], max_tokens=3)
    assert result.finish_reason == "length"
    assert list(result.token_ids) == chain[1:4]  # the model did stop after the first half of 龘
    assert result.text == "".join(deltas) == "你好世界"
    assert all("\ufffd" not in d for d in deltas)


def test_the_whole_character_comes_out_when_the_limit_allows_it(chain_engine):
    engine, chain = chain_engine
    deltas, result = _run(engine, chain[:1], max_tokens=4)
    assert result.finish_reason == "length"
    assert result.text == "".join(deltas) == "你好世界龘"
    deltas, result = _run(engine, chain[:1], max_tokens=10)
    assert result.finish_reason == "stop" and result.text == "你好世界龘"
