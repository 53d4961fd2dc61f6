"""How long a `qwen-tray` command takes to start and finish when it needs no model: what a desktop
shortcut's `qwen-tray action NAME` costs before the tray even hears of it.

Each command runs in a fresh interpreter, for this tree and (``--peer-commit``) another commit's
app/ (``git archive`` into a temporary folder) in the same run, the two alternating round by
round. Wall time and the CPU time of the child (user + system, less disturbed by a busy machine)
are recorded; medians per command. One JSON with machine, date and commit:

    python -m benchmarks.bench_cli_startup --peer-commit 386c668 --out docs/results/cli_startup_cpu.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["--version"], ["models", "list"], ["action", "--list"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--peer-commit", help="also measure this commit's CLI (e.g. 386c668)")
    p.add_argument("--rounds", type=int, default=7, help="runs of each command per tree (default 7)")
    p.add_argument("--out", type=Path, default=ROOT / "docs/results/cli_startup_cpu.json")
    p.add_argument("--commit", help="commit measured (default: git rev-parse HEAD, + '-dirty' when modified)")
    return p.parse_args(argv)


def run_once(source: Path, command: list[str], home: Path) -> dict | None:
    """One fresh `python -m app.cli COMMAND` from ``source``: wall and CPU seconds; None when the
    command does not exist there (an older commit)."""
    env = {**os.environ, "PYTHONPATH": str(source), "QWEN_TRAY_HOME": str(home)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env, cwd=source, capture_output=True,
                          text=True, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        return None
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def medians(samples: list[dict]) -> dict:
    return {key: round(statistics.median(s[key] for s in samples), 3) for key in ("wall_s", "cpu_s")}


def export_commit(commit: str, folder: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "app"], check=True, capture_output=True)
    tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(folder, filter="data")
    return folder


def git_commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "app"], capture_output=True, text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    load = os.getloadavg() if sys.platform != "win32" else None
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": load}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = {"tool": "benchmarks/bench_cli_startup.py", "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "commit": args.commit or git_commit(), "machine": machine(), "rounds": args.rounds,
              "peer_commit": args.peer_commit, "trees": {}}
    with tempfile.TemporaryDirectory() as work:
        trees = {f"this tree {result['commit']}": ROOT}
        if args.peer_commit:
            trees[f"peer {args.peer_commit}"] = export_commit(args.peer_commit, Path(work) / "peer")
        samples: dict[str, dict[str, list[dict]]] = {label: {" ".join(c): [] for c in COMMANDS} for label in trees}
        for _round in range(args.rounds):
            for label, source in trees.items():  # alternating: a busy moment costs both trees alike
                for command in COMMANDS:
                    measured = run_once(source, command, Path(work) / "home")
                    if measured is not None:
                        samples[label][" ".join(command)].append(measured)
        for label, by_command in samples.items():
            result["trees"][label] = {command: medians(runs) for command, runs in by_command.items() if runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    for label, by_command in result["trees"].items():
        for command, numbers in by_command.items():
            print(f"{label:28} qwen-tray {command:14} wall {numbers['wall_s']:.2f} s  cpu {numbers['cpu_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
