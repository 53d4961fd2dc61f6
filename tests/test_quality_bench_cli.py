"""benchmarks/quality.py's command line: a part of a split run never overwrites the full report."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.quant.gptq import GptqSettings
from benchmarks.quality import Calibrate, main


@pytest.mark.parametrize("argv", [["--only", "ours"], ["--ours", "w4:gptq"], ["--mlp3", "rtn"],
                                  ["--only", "llama.cpp", "--llamacpp", "Q4_0"]])
def test_a_split_run_needs_a_partial_file(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "needs --partial FILE" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_an_unknown_family_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--only", "ours,llamacpp", "--partial", str(tmp_path / "p.json")])
    assert "--only: unknown llamacpp (known: dense, ours, sensitive, mlp3, control, llama.cpp)" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--gptq-damp", "0.3"], ["--calibration-tokens", "3229"],
                                  ["--calibration", "benchmarks/data/calibration_balanced.txt"]])
def test_a_study_of_calibration_settings_is_a_split_run_too(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "needs --partial FILE" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [(["--gptq-damp", "0"], "damp must be in (0, 1], got 0.0"),
                                           (["--no-gptq-static"], "act_order needs static scales")])
def test_bad_gptq_settings_are_named_in_one_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--partial", str(tmp_path / "p.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--gptq-*: {message}" in err and "Traceback" not in err


def test_rows_of_a_study_say_how_they_departed_from_the_product():
    study = Calibrate(3229, GptqSettings(damp=0.1, static=True, act_order=True), window=0)
    assert study.suffix("gptq") == " (damp=0.1, static=True, act_order=True, calibration 3229 tokens)"
    assert study.suffix("calibrated") == " (calibration 3229 tokens)"
    assert study.suffix("rtn") == "" and Calibrate().suffix("calibrated") == ""
    # a label names the departures from the plain algorithm, so the product's gptq says what it runs
    assert Calibrate().suffix("gptq") == (" (damp=0.1, static=True, act_order=True, "
                                          "calibration windows of 512)")
    assert Calibrate(gptq=GptqSettings(), window=0).suffix("gptq") == ""
    # the control calibrates in the windows its label names
    assert Calibrate().window_of("gptq") == 512 and Calibrate().window_of("calibrated") == 0
    assert Calibrate(window=0).window_of("gptq") == 0
    other_text = Calibrate(text=Path("benchmarks/data/calibration_balanced.txt"))
    assert other_text.suffix("awq") == " (calibration calibration_balanced.txt)"


def test_a_missing_calibration_text_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--calibration", str(tmp_path / "nope.txt"), "--partial", str(tmp_path / "p.json")])
    assert f"--calibration: {tmp_path / 'nope.txt'} not found" in capsys.readouterr().err
