"""benchmarks/quality.py's command line: a part of a split run never overwrites the full report."""

from __future__ import annotations

import pytest

from benchmarks.quality import main


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
