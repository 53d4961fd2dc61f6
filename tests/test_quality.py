"""Quantization quality on real text with the real starter model (benchmarks/quality.py's functions).

SmolLM2-135M-Instruct, 1024 held-out tokens of CPython's LICENSE.txt (the first 512 tokens
calibrate the ``calibrated`` method). Every model goes through quantize -> checkpoint -> load_model.
"""

from __future__ import annotations

import pytest

from benchmarks.quality import (
    dense_result,
    evaluation_ids,
    quantized_result,
    recovered_fraction,
)


@pytest.fixture(scope="module")
def quality(starter_model_dir, tmp_path_factory) -> dict[tuple[str, str], float]:
    ids = evaluation_ids(starter_model_dir, tokens=1024)
    assert len(ids) == 1024
    work = tmp_path_factory.mktemp("quality")
    results = [dense_result(starter_model_dir, ids)]
    for config, method in (("w4", "calibrated"), ("mixed", "calibrated"), ("all3", "rtn"), ("all3", "calibrated")):
        results.append(quantized_result(starter_model_dir, config, method, ids, work))
    return {(r.config, r.method): r.perplexity for r in results}


def test_more_bits_never_read_worse(quality):
    dense, w4, mixed = quality[("dense", "-")], quality[("w4", "calibrated")], quality[("mixed", "calibrated")]
    assert 6.0 < dense < 15.0, dense  # a working model on English text
    assert dense <= w4 <= mixed, (dense, w4, mixed)


def test_improved_3bit_recovers_a_third_of_rtn_loss(quality):
    dense, rtn, improved = quality[("dense", "-")], quality[("all3", "rtn")], quality[("all3", "calibrated")]
    assert improved <= rtn, (improved, rtn)
    assert rtn > 1.5 * dense  # 3 bits do hurt this small model, so the comparison means something
    assert recovered_fraction(dense, rtn, improved) >= 1 / 3, (dense, rtn, improved)
