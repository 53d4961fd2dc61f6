"""Bits where they matter (head rule, sensitivity recipes) and `qwen-tray checkpoint eval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.errors import QwenTrayError
from app.formats.recipe import BUILTIN_RECIPES, TABLES, Recipe, hf_tensor_shapes, load_recipe, plan_model
from app.quant.calibration import default_calibration_file
from app.quant.heldout import HELDOUT_FILES, heldout_file
from app.quant.quantizer import QuantizeJob, quantize_model
import torch

from app.quant.gptq import GptqSolver
from app.quant.quantizer import GPTQ_SETTINGS
from app.quant.sensitivity import _gptq_errors, measure, stored_shapes
from tests.conftest import assert_one_line_error

QWEN25_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "vocab_size": 152064, "model_type": "qwen2", "tie_word_embeddings": False}


@pytest.mark.parametrize("name", sorted(BUILTIN_RECIPES))
@pytest.mark.parametrize("tied", [False, True])
def test_every_builtin_recipe_keeps_the_head_at_4_bits_or_more(name, tied):
    recipe = BUILTIN_RECIPES[name]
    assert recipe.table_bits("lm_head", tied) >= 4
    if tied:  # the one table is also the head
        assert recipe.table_bits("model.embed_tokens", tied) >= 4


def test_tied_table_gets_the_head_bits_in_the_plan_and_mixed_7b_keeps_its_size():
    mixed = BUILTIN_RECIPES["mixed"]
    tied_plan = plan_model(mixed, hf_tensor_shapes({**QWEN25_7B, "tie_word_embeddings": True}))
    assert next(t for t in tied_plan.tensors if t.name == "model.embed_tokens.weight").bits == 4
    # The head at 4 bits is paid for by the untied embedding at 3 (equal shapes on the 7B), so
    # the 7B mixed checkpoint weighs what it did with a 3-bit head and the VRAM plan is unchanged.
    old = Recipe("old-mixed", tuple((p, b) for p, b in mixed.rules if p not in TABLES)
                 + (("model.embed_tokens", 4), ("lm_head", 3)))
    shapes = hf_tensor_shapes(QWEN25_7B)
    plan = plan_model(mixed, shapes)
    assert plan.total_bytes == plan_model(old, shapes).total_bytes
    assert plan.gib <= 2.93 * 1.05
    assert next(t for t in plan.tensors if t.name == "lm_head.weight").bits == 4


def test_shipped_texts_are_separate_documents():
    calibration = default_calibration_file().read_text(encoding="utf-8")
    for language in HELDOUT_FILES:
        held_out = heldout_file(language).read_text(encoding="utf-8")
        sentences = {s.strip() for s in held_out.replace("。", ".").split(".") if len(s.strip()) > 20}
        assert sentences and not any(s in calibration for s in sentences)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in calibration) and "the" in calibration  # mixed English/Chinese


def test_sensitivity_recipe_is_reproducible_and_within_budget(tiny_qwen_dir, tmp_path, cli):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for out in (first, second):
        proc = cli("recipe", "sensitive", "--model", str(tiny_qwen_dir), "--base", "mixed", "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "units at 4 bits" in proc.stdout
    assert first.read_bytes() == second.read_bytes()  # the same measurement, the same recipe
    data = json.loads(first.read_text())
    assert data["provenance"]["method"] == "gptq"  # ranked by the default method's own errors
    recipe = load_recipe(first)
    shapes = stored_shapes(hf_tensor_shapes(json.loads((tiny_qwen_dir / "config.json").read_text())))
    assert plan_model(recipe, shapes).total_bytes <= plan_model(BUILTIN_RECIPES["mixed"], shapes).total_bytes
    assert data["provenance"]["budget_bytes"] == plan_model(BUILTIN_RECIPES["mixed"], shapes).total_bytes
    assert recipe.bits_for("lm_head") == 4 and set(data["bits"].values()) <= {3, 4}
    per_layer = [p for p in data["bits"] if p.startswith("model.layers.")]
    assert len(per_layer) == 2 * 7  # every unit of both layers named explicitly
    manifest = quantize_model(QuantizeJob(model=tiny_qwen_dir, out=tmp_path / "ckpt", recipe=recipe, method="rtn"))
    assert manifest.recipe.name == recipe.name


def test_gptq_sensitivity_is_the_output_error_gptq_leaves():
    """err_b = E||(W - Q_b) x||^2 over the calibration inputs, Q_b as the quantizer's GPTQ makes it
    (K = 200: padded to 256 like a checkpoint)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(600, 200, generator=gen) * torch.linspace(0.2, 3.0, 200)  # uneven channels
    w = torch.randn(48, 200, generator=gen)
    hessian = 2 * x.T @ x / x.shape[0]
    errors = _gptq_errors([w], hessian, "unit", "cpu")
    padded_h = torch.nn.functional.pad(hessian, (0, 56, 0, 56))
    q, scales = GptqSolver(padded_h, GPTQ_SETTINGS).quantize_int(torch.nn.functional.pad(w, (0, 56)), 4)
    deq = (q.float() * scales.float().repeat_interleave(128, dim=1))[:, :200]
    direct = float(((x @ (w - deq).T) ** 2).sum(dim=1).mean())
    assert errors[4] == pytest.approx(direct, rel=1e-3)
    assert errors[3] > 2 * errors[4] > 0  # 3 bits: twice the step, about four times the error


def test_sensitivity_ranks_units_by_the_chosen_methods_errors(tiny_qwen_dir):
    by_gptq = measure(tiny_qwen_dir, method="gptq")
    by_clipping = measure(tiny_qwen_dir, method="calibrated")
    assert [(u.layer, u.unit) for u in by_gptq] == [(u.layer, u.unit) for u in by_clipping]
    assert all(u.gain > 0 for u in by_gptq + by_clipping)
    # GPTQ compensates rounding error the clipping search leaves: 3 bits lose less under it.
    assert sum(u.gain for u in by_gptq) < sum(u.gain for u in by_clipping)


def test_sensitivity_recipe_bad_input_is_one_line(tiny_qwen_dir, tmp_path, cli):
    assert_one_line_error(cli("recipe", "sensitive", "--model", str(tmp_path), "--out", str(tmp_path / "r.json")),
                          "config.json")
    assert_one_line_error(cli("recipe", "sensitive", "--model", str(tiny_qwen_dir), "--out", str(tmp_path / "r.toml")),
                          ".json")
    assert_one_line_error(cli("recipe", "sensitive", "--model", str(tiny_qwen_dir), "--budget-gib", "0.00001",
                              "--out", str(tmp_path / "r.json")), "budget")
    with pytest.raises(QwenTrayError, match="gptq or calibrated"):
        measure(tiny_qwen_dir, method="awq")


@pytest.fixture(scope="module")
def tiny_w4(tiny_qwen_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "tiny-w4"
    quantize_model(QuantizeJob(model=tiny_qwen_dir, out=out, recipe=load_recipe("w4"), method="gptq"))
    return out


def test_checkpoint_eval_scores_checkpoint_and_source(cli, tiny_w4, tiny_qwen_dir):
    proc = cli("checkpoint", "eval", str(tiny_w4), "--source", str(tiny_qwen_dir), "--device", "cpu", "--tokens", "300")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("checkpoint ") and lines[1].startswith("source ")
    assert "en " in lines[0] and "zh " in lines[0] and "(299 tokens)" in lines[0] and "vs source" in lines[0]
    ppl = [float(line.split("perplexity ")[1].split()[0]) for line in lines]
    assert all(p > 1.0 for p in ppl)  # a random tiny model: high perplexity, but a real number


def test_checkpoint_eval_errors_are_one_line(cli, tiny_w4, tmp_path):
    assert_one_line_error(cli("checkpoint", "eval", str(tmp_path / "missing")), "missing", "not found")
    assert_one_line_error(cli("checkpoint", "eval", str(tiny_w4), "--source", str(tmp_path / "nope")), "nope")
    assert_one_line_error(cli("checkpoint", "eval", str(tiny_w4), "--tokens", "1"), "--tokens")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("checkpoint", "eval", str(tmp_path / "empty")), "empty")


def test_quantize_and_recipe_sensitive_take_a_registered_name(tiny_qwen_dir, tmp_path, cli):
    """--model NAME, as ask, serve and tray take it; the checkpoint names the model by it."""
    from app.formats.checkpoint import read_manifest

    assert cli("models", "add", "tiny", str(tiny_qwen_dir)).returncode == 0
    recipe = tmp_path / "r.json"
    proc = cli("recipe", "sensitive", "--model", "tiny", "--base", "mixed", "--out", str(recipe))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(recipe.read_text())["provenance"]["model"] == "tiny"
    proc = cli("quantize", "--model", "tiny", "--recipe", "w4", "--method", "rtn", "--out", str(tmp_path / "q"))
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(tmp_path / "q").model_id == "tiny"
    assert_one_line_error(cli("quantize", "--model", "nope", "--recipe", "w4", "--out", str(tmp_path / "n")),
                          "nope", "no registered model has that name")


def test_quantize_sequential_with_the_recipe_sensitive_wrote(tiny_qwen_dir, tmp_path, cli):
    """The command `recipe sensitive` suggests runs, and writes what QuantizeJob with sequential GPTQ does."""
    from dataclasses import replace

    from safetensors.torch import load_file

    recipe = tmp_path / "r.json"
    proc = cli("recipe", "sensitive", "--model", str(tiny_qwen_dir), "--out", str(recipe))
    assert proc.returncode == 0, proc.stderr
    # a log (no terminal) gets a line per tenth of the layers: the tiny model's 2 layers, each
    layers = [line for line in proc.stderr.splitlines() if line.startswith("measuring ")]
    assert layers == [f"measuring {tiny_qwen_dir.name}: layer 1 (1/2)", f"measuring {tiny_qwen_dir.name}: layer 2 (2/2)"]
    suggested = proc.stdout.strip().splitlines()[-1]
    assert suggested.endswith(f"--recipe {recipe} --method gptq --sequential --out DIR")
    args = suggested.removeprefix("quantize with it: qwen-tray ").replace("DIR", str(tmp_path / "cli")).split()
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    job = QuantizeJob(model=tiny_qwen_dir, out=tmp_path / "job", recipe=load_recipe(recipe),
                      gptq=replace(GPTQ_SETTINGS, sequential=True))
    quantize_model(job)
    quantize_model(QuantizeJob(model=tiny_qwen_dir, out=tmp_path / "plain", recipe=load_recipe(recipe)))
    for name in ("layer_001.safetensors",):
        cli_tensors, job_tensors = load_file(tmp_path / "cli" / name), load_file(tmp_path / "job" / name)
        assert all(torch.equal(cli_tensors[k], job_tensors[k]) for k in job_tensors)
        # layer 1's Hessians saw layer 0 as quantized: not what the float calibration gives
        assert any(not torch.equal(job_tensors[k], t) for k, t in load_file(tmp_path / "plain" / name).items()
                   if k.endswith("qweight") or k.endswith("qlow"))
    assert_one_line_error(cli("quantize", "--model", str(tiny_qwen_dir), "--recipe", "w4", "--method", "rtn",
                              "--sequential", "--out", str(tmp_path / "n")), "--sequential", "gptq")
