"""``qwen-tray doctor``: the machine's facts and each registered model's load, read from metadata."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from app.commands.doctor import _gpu_line, _model_verdict, model_weights
from app.engine.cuda.memory import GiB, RTX_3050_LAPTOP, gib, spec_to_hf_config
from app.formats.checkpoint import FileEntry, Manifest, TensorEntry, write_manifest
from app.formats.recipe import BUILTIN_RECIPES, hf_tensor_shapes, plan_model
from tests.test_cuda_runtime import QWEN3B, QWEN7B

SM75 = "GPU NVIDIA GeForce GTX 1650 has compute capability 7.5; the kernels need 8.0 or newer"


def manifest_only_checkpoint(folder: Path, spec, recipe_name: str) -> Path:
    """A checkpoint folder holding only the manifest of ``spec`` under a built-in recipe:
    what doctor reads (no weight file is opened)."""
    recipe = BUILTIN_RECIPES[recipe_name]
    plan = plan_model(recipe, hf_tensor_shapes(spec_to_hf_config(spec)))
    tensors = {t.name: TensorEntry("weights.safetensors", "fp16" if t.bits == 16 else f"w{t.bits}", t.shape)
               for t in plan.tensors}
    folder.mkdir()
    write_manifest(folder, Manifest(spec=spec, recipe=recipe, method="rtn", tensors=tensors,
                                    files={"weights.safetensors": FileEntry(plan.total_bytes, "0" * 64)}))
    return folder


def test_doctor_on_this_machine_names_what_is_missing_and_every_model(cli, tmp_path, tiny_qwen_dir):
    assert cli("models", "add", "tiny", str(tiny_qwen_dir), "--default").returncode == 0
    gone = tmp_path / "gone-model"
    gone.mkdir()
    shutil.copy(tiny_qwen_dir / "config.json", gone)
    assert cli("models", "add", "gone", str(gone)).returncode == 0
    shutil.rmtree(gone)  # deleted after it was registered
    done = cli("doctor")
    assert done.returncode == 1, done.stderr  # a registered model is missing
    lines = done.stdout.splitlines()
    assert lines[0].startswith("qwen-tray ") and f"PyTorch {torch.__version__}" in lines[1]
    if not torch.cuda.is_available():
        assert "GPU: none visible to PyTorch" in lines
        from app.kernels.no_cuda import why_no_cuda

        assert f"CUDA kernels: unavailable: {why_no_cuda()}" in lines  # (a CPU-only build, no driver, too old a driver)
        assert lines[2].startswith("NVIDIA driver: ")  # beside PyTorch's CUDA version
        weights = model_weights(tiny_qwen_dir)[1]  # Qwen's vocabulary: 2 x 151,936 x 64 fp16 embeddings
        assert f"* tiny: float16 folder, {gib(weights)} of weights; on the CPU" in lines
    assert f"  gone: missing ({gone})" in lines
    assert lines[-1] == "1 registered model cannot be loaded: gone (exit status 1)"
    if importlib.util.find_spec("cupy") is None:  # the command that works from a checkout (not on PyPI)
        assert ('CuPy: not installed (in the qwen-tray folder: pip install -e ".[cuda12]"; '
                '".[cuda13]" with a CUDA 13 build of PyTorch)') in lines
    assert done.stderr == ""


def test_doctor_reads_each_models_tokenizer_and_weight_headers_and_exits_1_for_a_broken_one(cli, tmp_path,
                                                                                           tiny_qwen_dir):
    folders = {name: tmp_path / name for name in ("ok", "no-tokenizer", "cut-weights")}
    for name, folder in folders.items():
        shutil.copytree(tiny_qwen_dir, folder)
        assert cli("models", "add", name, str(folder)).returncode == 0
    (folders["no-tokenizer"] / "tokenizer.json").write_bytes(b"")
    with open(folders["cut-weights"] / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    quantized = tmp_path / "q"
    assert cli("quantize", "--model", "ok", "--recipe", "w4", "--method", "rtn", "--out", str(quantized)).returncode == 0
    assert cli("models", "add", "q-cut", str(quantized)).returncode == 0
    with open(quantized / "layer_001.safetensors", "r+b") as f:
        f.truncate(1000)
    done = cli("doctor")
    assert done.returncode == 1 and done.stderr == ""
    verdicts = {line.split(":")[0].strip(" *"): line.split(": ", 1)[1] for line in done.stdout.splitlines()
                if line[:2] in ("* ", "  ") and ": " in line}
    assert verdicts["ok"].startswith("float16 folder, ")
    assert verdicts["no-tokenizer"].startswith(f"cannot be read: {folders['no-tokenizer'] / 'tokenizer.json'}: "
                                               "cannot read tokenizer (EOF while parsing")
    assert verdicts["cut-weights"].startswith(f"cannot be read: {folders['cut-weights'] / 'model.safetensors'}: "
                                              "cannot read safetensors file (")
    assert verdicts["q-cut"].startswith(f"cannot be read: {quantized / 'layer_001.safetensors'}: file is truncated "
                                        "(1000 bytes, manifest.json says ")
    assert done.stdout.splitlines()[-1] == ("3 registered models cannot be loaded: cut-weights, no-tokenizer, q-cut "
                                            "(exit status 1)")
    (quantized / "layer_001.safetensors").unlink()
    for name in ("no-tokenizer", "cut-weights", "q-cut"):
        assert cli("models", "remove", name, "--keep-files").returncode == 0
    assert cli("doctor").returncode == 0


def test_the_7b_mixed_checkpoint_is_fitted_to_a_3050(tmp_path):
    folder = manifest_only_checkpoint(tmp_path / "7b", QWEN7B, "mixed")
    spec, weights, kind = model_weights(folder)
    assert kind == "'mixed' checkpoint" and spec == QWEN7B
    assert 2.9 * GiB < weights < 2.95 * GiB  # the seed project's 2.93 GiB
    verdict = _model_verdict(folder, "Qwen2.5-7B-mixed", RTX_3050_LAPTOP, None)
    assert verdict.startswith("'mixed' checkpoint, 2.9")
    assert "; on the GPU as 1 x " in verdict  # four requests of 4,096 do not fit 3.15 GiB: one, shorter
    slots, context = verdict.split("; on the GPU as ")[1].split(" tokens")[0].split(" x ")
    assert int(slots) == 1 and 1024 <= int(context) < 4096


def test_the_3b_w4_checkpoint_takes_the_trays_whole_load_on_a_3050(tmp_path):
    folder = manifest_only_checkpoint(tmp_path / "3b", QWEN3B, "w4")
    verdict = _model_verdict(folder, "Qwen2.5-3B-w4", RTX_3050_LAPTOP, None)
    assert "; on the GPU as 4 x 4096 tokens (VRAM plan" in verdict


def test_without_the_kernels_a_7b_goes_to_the_cpu_and_a_missing_folder_is_named(tmp_path):
    folder = manifest_only_checkpoint(tmp_path / "7b", QWEN7B, "mixed")
    verdict = _model_verdict(folder, "Qwen2.5-7B-mixed", RTX_3050_LAPTOP, SM75)
    assert verdict.endswith("; on the CPU (too large for the GPU without the kernels)")
    assert _model_verdict(tmp_path / "nowhere", "x", RTX_3050_LAPTOP, None) == f"missing ({tmp_path / 'nowhere'})"


def test_the_gpu_line_gives_the_default_budget_or_says_too_little_is_free():
    assert _gpu_line(RTX_3050_LAPTOP) == ("GPU: NVIDIA GeForce RTX 3050 Laptop GPU, SM 8.6, 16 SMs, 4.00 GiB "
                                          "(3.40 GiB free; default VRAM budget 3.15 GiB)")
    full = replace(RTX_3050_LAPTOP, free_bytes=200 * 2**20)
    assert _gpu_line(full).endswith("(0.20 GiB free; too little free for a model)")
