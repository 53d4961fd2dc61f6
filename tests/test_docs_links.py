"""The docs stay navigable: every relative link resolves, every result file is indexed, and every
benchmark / lab / script a current doc names exists and is run the way the package is laid out.

A moved or deleted file breaks README or a doc page silently; this test says which line names it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...
# A path to a tool, or the command that runs one, in a doc's text or code blocks.
TOOL_PATH = re.compile(r"(?<![\w/.-])((?:benchmarks|lab|scripts)/[\w./-]*\w)")
MODULE_COMMAND = re.compile(r"python3? -m ((?:benchmarks|lab|scripts)(?:\.\w+)+)")
SCRIPT_COMMAND = re.compile(r"python3? ((?:benchmarks|lab|scripts)/\w+\.py)")


def markdown_files() -> list[Path]:
    """README*.md, every page under docs/, and the READMEs of benchmarks/ and lab/."""
    files = sorted(ROOT.glob("README*.md")) + sorted((ROOT / "docs").rglob("*.md"))
    return files + [p for p in (ROOT / "benchmarks" / "README.md", ROOT / "lab" / "README.md") if p.exists()]


def current_docs() -> list[Path]:
    """The pages that describe the tree as it is (docs/history keeps the paths of its time)."""
    history = ROOT / "docs" / "history"
    return [p for p in markdown_files() if history not in p.parents]


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link of ``page``, anchors dropped."""
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        for target in LINK.findall(line):
            if SCHEME.match(target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path:
                found.append((number, path))
    return found


def where(page: Path, number: int) -> str:
    return f"{page.relative_to(ROOT).as_posix()}:{number}"


def test_every_relative_link_resolves():
    broken = [f"{where(page, number)} -> {target}"
              for page in markdown_files() for number, target in links(page)
              if not (page.parent / target).exists()]
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_result_file_is_indexed():
    index = RESULTS / "README.md"
    listed = {(RESULTS / target).resolve() for _, target in links(index)}
    missing = [p.relative_to(RESULTS).as_posix() for p in sorted(RESULTS.rglob("*"))
               if p.is_file() and p != index and p.resolve() not in listed]
    assert not missing, ("docs/results/README.md has no row for (add one: what produced it, commit, date, "
                         "machine, which doc cites it):\n" + "\n".join(missing))


def test_the_tools_a_doc_names_exist():
    problems = []
    for page in current_docs():
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            if "<" in line and ">" in line:  # placeholders (bench_<what>.py, decode_budget_<gpu>.json)
                line = re.sub(r"\S*<[^>]*>\S*", "", line)
            for path in TOOL_PATH.findall(line):
                if not (ROOT / path).exists():
                    problems.append(f"{where(page, number)}: {path} does not exist")
            for module in MODULE_COMMAND.findall(line):
                if not (ROOT / (module.replace(".", "/") + ".py")).exists():
                    problems.append(f"{where(page, number)}: python -m {module}: no such module")
            for script in SCRIPT_COMMAND.findall(line):
                module = script[:-3].replace("/", ".")
                problems.append(f"{where(page, number)}: `python {script}`: run it as `python -m {module}`")
    assert not problems, "\n".join(problems)


CODE_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_ci_runs_the_readmes_test_command():
    """The block after "Run the tests" / "运行测试" in each README is a command .ci/run runs as it is."""
    ci_lines = {line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()}
    for page, heading in (("README.md", "Run the tests"), ("README.zh-CN.md", "运行测试")):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert heading in text, f"{page} has no '{heading}' paragraph"
        block = CODE_BLOCK.search(text, text.index(heading))
        assert block is not None, f"{page}: no bash block after '{heading}'"
        commands = [line for line in block.group(1).splitlines() if line.strip()]
        assert commands and all(command.strip() in ci_lines for command in commands), (
            f"{page}: .ci/run does not run the README's test command {commands}")
