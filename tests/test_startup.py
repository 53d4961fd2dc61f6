"""A process that loads a model and answers: what it imports, and how it ends.

Each check runs a fresh interpreter (``python -c``): what a module imported in this test
process says nothing about a cold start. How fast the start is, is measured by
``python -m benchmarks.bench_startup`` (no wall-clock thresholds here).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.formats.recipe import BUILTIN_RECIPES

ROOT = Path(__file__).resolve().parents[1]
# Compiler machinery a load must not pull in: torch._dynamo / torch.compile and what it drags
# along (sympy through torch.fx's symbolic shapes, FSDP); seconds of import each.
COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes", "sympy",
                    "torch.distributed.fsdp")
# Needed only by some paths: a GGUF import, the quantizer's oracle.
OPTIONAL_MODULES = ("transformers", "gguf")

LOAD_AND_ANSWER = """
import json, sys
import torch
from app.engine import Engine, SamplingParams
from app.engine.quantized.modules import QuantLinear
path, dtype = sys.argv[1], sys.argv[2]
engine = Engine.load(path, device="cpu", max_batch_size=1, dtype=None if dtype == "auto" else getattr(torch, dtype))
text = engine.complete("Hello", SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)).text()
watched = {watched}
print(json.dumps({{"imported": [m for m in watched if m in sys.modules], "backend": {backend}}}))
{close}
"""
# how the quantized linears compute (app.engine.quantized.modules), e.g. ["int4_linear"]
BACKEND = "sorted({m.backend.__name__ for m in engine.loaded.model.modules() if isinstance(m, QuantLinear)})"


def run_python(code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT, check=False)


def load_and_answer(path: Path, dtype: str = "auto", close: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
    code = LOAD_AND_ANSWER.format(watched=COMPILER_MODULES + OPTIONAL_MODULES, backend=BACKEND,
                                  close="engine.close()" if close else "")
    proc = run_python(code, str(path), dtype)
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, qwen_tokenizer_dir) -> Path:
    from app.quant.quantizer import QuantizeJob, quantize_model
    from tests.conftest import build_tiny_model

    src = build_tiny_model(tmp_path_factory.mktemp("tiny-src"), qwen_tokenizer_dir, "qwen2", hidden_size=128,
                           intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)
    out = tmp_path_factory.mktemp("tiny-w4")
    quantize_model(QuantizeJob(src, out, BUILTIN_RECIPES["w4"], method="rtn"))
    return out


def test_loading_a_model_folder_and_answering_imports_no_compiler(tiny_qwen_dir):
    _, seen = load_and_answer(tiny_qwen_dir)
    assert seen["imported"] == []


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])  # the dense backend, and the CPU int4 kernel's
def test_loading_a_checkpoint_and_answering_imports_no_compiler(tiny_checkpoint, dtype):
    from app.engine.quantized import cpu_int4

    if dtype == "bfloat16" and not cpu_int4.available():
        pytest.skip("this PyTorch build has no CPU int4 kernel")
    _, seen = load_and_answer(tiny_checkpoint, dtype)
    assert seen["imported"] == []
    assert seen["backend"] == (["int4_linear"] if dtype == "bfloat16" else ["dense_linear"])


GPU_LOAD_ON_THE_HOST = """
import json, sys
import torch
from app.engine.cuda.weights import module_to_arena, weights_from_model
from app.engine.skeleton import load_skeleton
skeleton = load_skeleton(sys.argv[1], max_context=64)
weights_from_model(skeleton.loaded.model)  # what the VRAM plan reads: shapes only
module_to_arena(skeleton.loaded.model, torch.device("cpu"))  # the arena (on the GPU there)
skeleton.fill()
weights_from_model(skeleton.loaded.model)
print(json.dumps([m for m in {watched} if m in sys.modules]))
"""


@pytest.mark.parametrize("kind", ["folder", "checkpoint"])
def test_the_gpu_loads_host_side_imports_no_compiler(kind, tiny_qwen_dir, tiny_checkpoint):
    """Engine.load(device="cuda") up to the runner, with the arena on the CPU: the skeleton on
    the meta device (where torch.cat and empty_like would import torch._dynamo), the plan's view
    of it, the weights read in. (The runner's own imports: test_cuda_runtime's gpu tests.)"""
    path = tiny_qwen_dir if kind == "folder" else tiny_checkpoint
    proc = run_python(GPU_LOAD_ON_THE_HOST.format(watched=COMPILER_MODULES + OPTIONAL_MODULES), str(path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["folder", "checkpoint"])
def test_loading_on_the_gpu_and_answering_imports_no_compiler(kind, tiny_qwen_kernel_dir, tiny_checkpoint):
    """The whole GPU load: the kernels built (or taken from CuPy's cache), graphs captured."""
    code = LOAD_AND_ANSWER.replace('device="cpu"', 'device="cuda"').format(
        watched=COMPILER_MODULES + OPTIONAL_MODULES, backend="[]", close="engine.close()")
    proc = run_python(code, str(tiny_qwen_kernel_dir if kind == "folder" else tiny_checkpoint), "auto")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["imported"] == []


def test_a_script_that_never_closes_its_engine_exits_cleanly(tiny_qwen_dir):
    """The scheduler thread is stopped at exit: a daemon thread still inside PyTorch when the
    interpreter finalizes aborts the process ("terminate called without an active exception")."""
    for _ in range(2):  # the abort was a race, lost most of the time: two runs
        proc, _ = load_and_answer(tiny_qwen_dir, close=False)
        assert "terminate called" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_an_engine_dropped_without_close_stops_its_thread_and_frees_the_runner(tiny_qwen_dir):
    import weakref

    from app.engine import Engine, SamplingParams

    def schedulers() -> int:
        return sum(t.name == "qwen-tray-scheduler" for t in threading.enumerate())

    before = schedulers()
    engine = Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1, max_context=64)
    engine.complete("Hi", SamplingParams(max_tokens=2, temperature=0)).wait(60)
    runner = weakref.ref(engine.runner)
    assert schedulers() == before + 1
    del engine
    gc.collect()
    assert schedulers() == before and runner() is None
