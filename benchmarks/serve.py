"""Throughput and latency of a running OpenAI-compatible server versus concurrency.

    qwen-tray serve --model PATH &                       # or any OpenAI-compatible server
    python -m benchmarks.serve http://127.0.0.1:18000/v1 --concurrency 1,2,4,8

For each concurrency level C it keeps C streaming chat requests in flight (each with a
fixed number of output tokens: ``ignore_eos``), and reports aggregate output tokens/s,
time to first token (TTFT) and time per output token (TPOT, after the first) percentiles.
Results go to ``docs/results/serve-<model>.json``. Stdlib only (plus app.server.sse).
As a library: ``benchmark(parse_args([url, ...]))`` returns the report (serve_synthetic.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from app.server.sse import DONE, iter_event_data

RESULTS_DIR = Path(__file__).resolve().parents[1] / "docs" / "results"
PROMPT_WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly "
                "judge boxing matches near old stone bridges").split()


@dataclass(slots=True)
class RequestTiming:
    ok: bool
    ttft_s: float = 0.0  # request sent -> first content piece
    total_s: float = 0.0
    completion_tokens: int = 0
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (None with fewer than 2 tokens)."""
        n = self.completion_tokens - 1
        return (self.total_s - self.ttft_s) / n if n > 0 else None


class Target:
    def __init__(self, url: str, api_key: str | None, timeout: float):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        self.https = parts.scheme == "https"
        self.netloc = parts.netloc
        path = parts.path.rstrip("/")
        self.prefix = path if path.endswith("/v1") else path + "/v1"
        self.root = path[: -len("/v1")] if path.endswith("/v1") else path
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.netloc, timeout=self.timeout)

    def get_json(self, path: str) -> tuple[int, dict]:
        conn = self.connect()
        try:
            conn.request("GET", path, headers=self.headers)
            response = conn.getresponse()
            body = response.read()
            try:
                return response.status, json.loads(body)
            except ValueError:
                return response.status, {}
        finally:
            conn.close()


def make_prompt(words: int, salt: int) -> str:
    """A prompt of about ``words`` words; ``salt`` makes each request's prompt different."""
    picked = [PROMPT_WORDS[(i * 7 + salt) % len(PROMPT_WORDS)] for i in range(words)]
    return f"Request {salt}. Continue this text: " + " ".join(picked)


def run_one(target: Target, model: str, prompt: str, max_tokens: int, ignore_eos: bool,
            sampling: dict | None = None) -> RequestTiming:
    """One streamed chat request; ``sampling``: temperature / top_p (default greedy)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, **(sampling or {})}
    if ignore_eos:
        body["ignore_eos"] = True
    conn = target.connect()
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        conn.request("POST", target.prefix + "/chat/completions", json.dumps(body), target.headers)
        response = conn.getresponse()
        if response.status != 200:
            return RequestTiming(False, error=f"HTTP {response.status}: {response.read()[:200]!r}")
        for data in iter_event_data(iter(response.readline, b"")):
            if data == DONE:
                break
            event = json.loads(data)
            if "error" in event:
                return RequestTiming(False, error=str(event["error"].get("message")))
            if first is None and any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                first = time.perf_counter()
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
        end = time.perf_counter()
    except OSError as exc:
        return RequestTiming(False, error=repr(exc))
    finally:
        conn.close()
    return RequestTiming(True, (first or end) - start, end - start, tokens)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered = sorted(values)

    def pick(q: float) -> float:  # nearest-rank percentile
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return {"mean": statistics.fmean(ordered), "p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99)}


def run_level(target: Target, model: str, concurrency: int, requests: int, args) -> dict:
    """Keep ``concurrency`` requests in flight until ``requests`` have completed."""
    counter = iter(range(requests))
    lock = threading.Lock()
    timings: list[RequestTiming] = []

    def worker() -> None:
        while True:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            timing = run_one(target, model, make_prompt(args.prompt_words, index), args.max_tokens,
                             not args.no_ignore_eos, sampling_of(args))
            with lock:
                timings.append(timing)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for _ in range(concurrency):
            pool.submit(worker)
    wall = time.perf_counter() - started
    ok = [t for t in timings if t.ok]
    tokens = sum(t.completion_tokens for t in ok)
    return {
        "concurrency": concurrency, "requests": requests, "succeeded": len(ok),
        "errors": sorted({t.error for t in timings if not t.ok})[:5],
        "wall_s": wall, "completion_tokens": tokens, "output_tokens_per_s": tokens / wall if wall else 0.0,
        # with ignore_eos every request should give exactly max_tokens: min/max show one that did not
        "completion_tokens_min": min((t.completion_tokens for t in ok), default=None),
        "completion_tokens_max": max((t.completion_tokens for t in ok), default=None),
        "requests_per_s": len(ok) / wall if wall else 0.0,
        "ttft_s": percentiles([t.ttft_s for t in ok]),
        "tpot_s": percentiles([t.tpot_s for t in ok if t.tpot_s is not None]),
        "latency_s": percentiles([t.total_s for t in ok]),
    }


TABLE_HEADER = f"{'conc':>4} {'ok':>5} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9}"


def _ms(value: float | None) -> str:
    return f"{value * 1000:7.1f}ms" if value is not None else f"{'-':>9}"


def table_row(level: dict) -> str:
    ok = f"{level['succeeded']}/{level['requests']}"
    return (f"{level['concurrency']:>4} {ok:>5} {level['output_tokens_per_s']:8.1f} {_ms(level['ttft_s']['p50'])} "
            f"{_ms(level['ttft_s']['p90'])} {_ms(level['tpot_s']['p50'])} {_ms(level['tpot_s']['p90'])}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:18000/v1")
    p.add_argument("--model", help="model id (default: the first one the server lists)")
    p.add_argument("--api-key", help="bearer token, if the server needs one")
    p.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels (default 1,2,4,8)")
    p.add_argument("--requests", type=int, default=0, help="requests per level (default: 4 x concurrency, >= 8)")
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    p.add_argument("--prompt-words", type=int, default=64, help="approximate prompt length in words (default 64)")
    p.add_argument("--no-ignore-eos", action="store_true", help="for servers without the ignore_eos extension")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1: off)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request socket timeout, seconds")
    p.add_argument("--out", type=Path, help="JSON output path (default docs/results/serve-<model>.json)")
    return p.parse_args(argv)


class ServeBenchError(Exception):
    """The server cannot be benchmarked (it does not list its models)."""


def sampling_of(args: argparse.Namespace) -> dict:
    """The request body's sampling fields (top_p only when it filters)."""
    return {"temperature": args.temperature} | ({"top_p": args.top_p} if args.top_p < 1.0 else {})


def benchmark(args: argparse.Namespace) -> dict:
    """Measure every level of ``args.concurrency`` against ``args.url`` (a table row printed per
    level); returns the report. Library entry point: build ``args`` with :func:`parse_args`."""
    target = Target(args.url, args.api_key, args.timeout)
    status, models = target.get_json(target.prefix + "/models")
    if status != 200:
        raise ServeBenchError(f"{args.url}/models answered HTTP {status}: {models}")
    model = args.model or models["data"][0]["id"]
    _, health = target.get_json(target.root + "/health")
    levels_wanted = [int(c) for c in args.concurrency.split(",") if c.strip()]
    run_one(target, model, make_prompt(args.prompt_words, -1), 4, not args.no_ignore_eos, sampling_of(args))  # warm-up
    levels = []
    print(f"{model} at {args.url}: {args.max_tokens} output tokens per request")
    print(TABLE_HEADER)
    for concurrency in levels_wanted:
        requests = args.requests or max(8, 4 * concurrency)
        levels.append(run_level(target, model, concurrency, requests, args))
        print(table_row(levels[-1]), flush=True)
    return {
        "benchmark": "serve", "url": args.url, "model": model, "server_health": health,
        "max_tokens": args.max_tokens, "prompt_words": args.prompt_words, "ignore_eos": not args.no_ignore_eos,
        "sampling": sampling_of(args),
        "client": {"python": platform.python_version(), "platform": platform.platform()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "levels": levels,
    }


def write_report(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out)  # atomic: a half-written result never replaces a good one


def all_succeeded(report: dict) -> bool:
    return all(lv["succeeded"] == lv["requests"] for lv in report["levels"])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = benchmark(args)
    except ServeBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = args.out or RESULTS_DIR / f"serve-{report['model'].replace('/', '_')}.json"
    write_report(out, report)
    print(f"wrote {out}")
    return 0 if all_succeeded(report) else 1


if __name__ == "__main__":
    sys.exit(main())
