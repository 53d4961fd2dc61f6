"""benchmarks/bench_cli_startup.py end to end, one round, this tree and a peer commit: it runs each
command in a fresh interpreter and writes its JSON. Only structure is asserted: timings on a shared
CPU mean nothing here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.bench_cli_startup import main

ROOT = Path(__file__).resolve().parents[1]


def test_bench_cli_startup_runs_and_reports(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("needs a git checkout for the peer commit's app/")
    out = tmp_path / "startup.json"
    assert main(["--rounds", "1", "--peer-commit", "HEAD", "--commit", "test", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["commit"] == "test" and result["date"] and result["machine"]["cpus"]
    assert set(result["trees"]) == {"this tree test", "peer HEAD"}
    for by_command in result["trees"].values():
        assert set(by_command) == {"--version", "models list", "action --list"}
        assert all(numbers["wall_s"] > 0 and numbers["cpu_s"] > 0 for numbers in by_command.values())
