"""The converted starter model is a real language model: perplexity on real English text."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

from app.engine.evaluate import perplexity
from app.engine.loading import load_model


def license_text() -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")


def test_starter_perplexity_on_cpython_license(starter_model_dir):
    loaded = load_model(starter_model_dir, torch.device("cpu"), max_context=2048)
    ids = loaded.tokenizer.encode(license_text())[:2048]
    ppl = perplexity(loaded.model, ids, window=2048)
    # SmolLM2-135M-Instruct (Q4_1 source) scores about 7.8 here; a broken layer, rope or
    # tokenizer gives tens to thousands.
    assert 6.0 < ppl < 9.5, ppl
