"""benchmarks/quality_report.py: the targets judged from rows, and parts merged into one report."""

from __future__ import annotations

import json

import pytest

from benchmarks.quality_report import main, merge, targets


def _row(family: str, label: str, ppl: float, bits: float) -> dict:
    return {"family": family, "label": label, "bits": {"linear": bits, "tables": bits, "overall": bits},
            "perplexity": {"en": ppl, "zh": ppl, "all": ppl}, "tokens": {"en": 10, "zh": 10},
            "seconds": 0.0, "extra": {}}


def _part(commit: str, rows: list[dict], **extra) -> dict:
    return {"date": "2026-12-05", "commit": commit, "machine": "x86_64", "torch": "2", "model": "m",
            "calibration": "c", "heldout": {"en": "en.txt", "zh": "zh.txt"}, "tokens_per_text": 10,
            "window": 512, "llamacpp": None, "results": rows, **extra}


ROWS = [_row("dense", "S (fp16)", 20.0, 16), _row("ours", "w4 calibrated", 28.0, 4.49),
        _row("ours", "w4 gptq", 25.0, 4.49), _row("llama.cpp", "Q4_0 + imatrix", 22.0, 5.35),
        _row("llama.cpp", "Q4_0 --pure + imatrix", 26.0, 4.5), _row("ours", "mixed gptq", 40.0, 3.86),
        _row("llama.cpp", "Q3_K_M + imatrix", 21.0, 5.45), _row("ours", "mlp3-only rtn", 40.0, 5.0),
        _row("ours", "mlp3-only gptq", 28.0, 5.0), _row("ours", "mlp3-only calibrated", 32.0, 5.0),
        _row("control", "all 4-bit, 32-wide groups, gptq", 24.0, 4.5),
        _row("control", "all 4-bit, 32-wide groups, calibrated", 27.0, 4.5)]
ROWS[6]["extra"] = {"types": {"ffn_down": {"Q4_K": 29, "Q5_K": 1}, "attn_q": {"Q4_0": 30}}}


def test_targets_judge_the_best_w4_and_each_mlp3_method():
    lines = "\n".join(targets(ROWS))
    assert "our best `w4` (w4 gptq" in lines and "25.000 vs 22.000: missed by +13.6%" in lines
    assert "25.000 vs 26.000: met" in lines  # equal bits everywhere: Q4_0 --pure + imatrix
    assert "Q4_0's grid (the control, all 4-bit, 32-wide groups, gptq): 24.000 vs 26.000: met" in lines
    assert "gptq at 32-wide groups (control) vs 128-wide (`w4`): 24.000 vs 25.000: the 128-wide group costs +4.2%" in lines
    assert "40.000 vs 21.000: missed by +90.5%" in lines  # mixed vs Q3_K_M + imatrix, the only larger mix
    assert "Q3_K_M + imatrix stores: attn_q Q4_0, ffn_down Q4_K/Q5_K" in lines
    assert "gptq 28.000 removes 60%: met" in lines  # (40 - 28) / (40 - 20)
    assert "calibrated 32.000 removes 40%: missed" in lines


def test_targets_say_what_was_not_measured():
    lines = targets([_row("dense", "S (fp16)", 20.0, 16)])
    assert sum("not measured in this run" in line for line in lines) == 3


def test_merging_a_merged_report_keeps_its_runs_and_commits(tmp_path):
    first = merge([_part("aaa", ROWS[:3]), _part("bbb", ROWS[3:5])])
    assert first["merged_from_runs"] == 2 and first["commit"] == "aaa, bbb"
    again = merge([first, _part("ccc", ROWS[5:]), _part("aaa", [_row("ours", "w4 gptq", 99.0, 4.49)])])
    assert again["merged_from_runs"] == 4 and again["commit"] == "aaa, bbb, ccc"
    assert [r["label"] for r in again["results"]] == [r["label"] for r in ROWS]  # the first measurement wins
    out = tmp_path / "quality.json"
    paths = []
    for i, part in enumerate((first, _part("ccc", ROWS[5:]))):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(part), encoding="utf-8")
    assert main(["--merge", str(out), "--note", "still unmeasured: x", *map(str, paths)]) == 0
    text = out.with_suffix(".md").read_text(encoding="utf-8")
    assert "**still unmeasured: x**" in text and "| ours | mlp3-only gptq |" in text
    assert json.loads(out.read_text(encoding="utf-8"))["merged_from_runs"] == 3


def test_parts_that_disagree_on_the_dense_model_are_refused():
    with pytest.raises(SystemExit, match="disagree"):
        merge([_part("a", [_row("dense", "S (fp16)", 20.0, 16)]), _part("b", [_row("dense", "S (fp16)", 21.0, 16)])])
    # the same model scored with another thread split: equal to 4 decimals, so the runs are comparable
    merged = merge([_part("a", [_row("dense", "S (fp16)", 19.6086304, 16)]),
                    _part("b", [_row("dense", "S (fp16)", 19.6086286, 16)])])
    assert [r["family"] for r in merged["results"]] == ["dense"]


def test_a_study_renders_its_table_without_the_targets_or_the_notes(tmp_path):
    path = tmp_path / "part.json"
    path.write_text(json.dumps(_part("aaa", ROWS[:3])), encoding="utf-8")
    out = tmp_path / "study.json"
    assert main(["--merge", str(out), "--study", "--note", "1024 tokens", str(path)]) == 0
    text = out.with_suffix(".md").read_text(encoding="utf-8")
    assert text.startswith("# Quantization settings study: m") and "**1024 tokens**" in text
    assert "| ours | w4 gptq |" in text and "## Targets" not in text and "## How this was measured" not in text


def test_help_prints_the_usage_instead_of_reading_a_file_named_help(capsys):
    assert main(["--help"]) == 0
    assert "--merge OUT.json" in capsys.readouterr().out
