"""README's Python API example, run as written (its model path aside) on the starter model: the
answer streams, then the finish reason and token counts follow on a line of their own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^\((stop|length): (\d+) prompt tokens, (\d+) generated\)$")


def python_api_example(page: str, heading: str) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index("```python\n", text.index(heading)) + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.mark.parametrize(("page", "heading"), [("README.md", "## Python API"), ("README.zh-CN.md", "## Python 接口")])
def test_the_example_shows_what_it_prints(page, heading):
    text = (ROOT / page).read_text(encoding="utf-8")
    example_end = text.index("```\n", text.index("```python\n", text.index(heading)) + 3)
    start = text.index("```text\n", example_end) + len("```text\n")
    assert text.index("```text\n", example_end) < text.index("\n## ", example_end)  # in the same section
    printed = text[start:text.index("```", start)].rstrip("\n").splitlines()
    assert len(printed) == 2 and SUMMARY.match(printed[1]), printed


@pytest.mark.parametrize(("page", "heading"), [("README.md", "## Python API"), ("README.zh-CN.md", "## Python 接口")])
def test_the_python_api_example_prints_the_answer_then_a_summary_line(starter_model_dir, page, heading):
    code = python_api_example(page, heading)
    assert code.count('"path/to/model"') == 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code.replace('"path/to/model"', repr(str(starter_model_dir)))],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    answer, _, summary = done.stdout.rstrip("\n").rpartition("\n")
    match = SUMMARY.match(summary)
    assert match, f"the last line is not the summary: {done.stdout!r}"
    assert answer.strip(), "no answer before the summary"
    assert int(match.group(2)) > 0 and 0 < int(match.group(3)) <= 64
