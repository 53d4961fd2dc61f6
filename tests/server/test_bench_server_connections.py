"""benchmarks/bench_server_connections.py end to end with a few connections: it starts the real
``qwen-tray serve`` process, holds slow connections, closes them, and writes its JSON.

Only structure is asserted: latencies on a shared CPU mean nothing here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_server_connections_runs_and_reports(tmp_path, qwen_tokenizer_dir):
    out = tmp_path / "connections.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(qwen_tokenizer_dir.parents[1]), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_server_connections.py"), "--connections", "40",
         "--baseline-s", "0.3", "--hold-s", "0.5", "--after-s", "0.5", "--commit", "test", "--out", str(out)],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["commit"] == "test" and result["date"] and result["machine"]["cpus"]
    (server,) = result["servers"]
    assert server["open"] == {"opened": 40, "failed": 0, "seconds": server["open"]["seconds"]}
    for phase in ("baseline", "hold", "after_close"):
        assert server[phase]["probes"] >= 1 and server[phase]["ok_200"] == server[phase]["probes"]
    assert server["still_serving"] is True
