"""Quantization quality with the real starter model on held-out text (the app's one evaluator).

SmolLM2-135M-Instruct, the first 512 tokens of each shipped held-out text (English, Chinese);
the calibration text is a different document. Every model goes through quantize -> checkpoint
-> load_model -> :func:`app.quant.heldout.score_folder`. benchmarks/quality.py runs the full
comparison (all methods, llama.cpp's quantizer) on more tokens.
"""

from __future__ import annotations

import pytest

from app.formats.recipe import load_recipe
from app.quant.heldout import score_folder
from app.quant.quantizer import QuantizeJob, quantize_model
from benchmarks.quality_report import recovered_fraction

TOKENS = 512


@pytest.fixture(scope="module")
def quality(starter_model_dir, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("quality")
    scores = {"dense": score_folder(starter_model_dir, max_tokens=TOKENS)}
    for recipe, method in (("w4", "gptq"), ("mixed", "rtn"), ("mixed", "gptq")):
        out = work / f"{recipe}-{method}"
        quantize_model(QuantizeJob(model=starter_model_dir, out=out, recipe=load_recipe(recipe), method=method))
        scores[(recipe, method)] = score_folder(out, max_tokens=TOKENS)
    return scores


def test_the_starter_model_reads_both_held_out_texts(quality):
    dense = quality["dense"]
    assert dense.tokens == {"en": TOKENS - 1, "zh": TOKENS - 1}
    # a working model: tens, not thousands (a broken layer, rope or tokenizer gives the latter)
    assert 5.0 < dense.perplexity["en"] < 80.0 and 3.0 < dense.perplexity["zh"] < 40.0, dense


def test_more_bits_never_read_worse(quality):
    dense, w4, mixed = (quality[k].overall for k in ("dense", ("w4", "gptq"), ("mixed", "gptq")))
    assert dense <= w4 <= mixed, (dense, w4, mixed)


def test_gptq_recovers_a_third_of_rtn_loss_on_3_bit_mlp(quality):
    # a regression guard; the target (>= 50 %) is judged on more tokens by benchmarks/quality.py
    dense, rtn, gptq = (quality[k].overall for k in ("dense", ("mixed", "rtn"), ("mixed", "gptq")))
    assert rtn > 1.3 * dense  # 3 bits do hurt this small model, so the comparison means something
    assert recovered_fraction(dense, rtn, gptq) >= 1 / 3, (dense, rtn, gptq)
