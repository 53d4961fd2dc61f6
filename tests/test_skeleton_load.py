"""The GPU load's path without the GPU: a model built as shapes on the meta device, placed in
one allocation, its weights read from the files into their places (app.engine.skeleton).

The places are an arena on the CPU here; on the GPU the same calls put them in VRAM
(``Engine.load(device="cuda")``, the gpu-marked tests of test_cuda_runtime.py). What is
checked: every tensor equals what the packed CPU load gives, the runtime's view of the
model is planned from the shapes alone, and the runner over the streamed weights computes
what the runner over the in-memory ones does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from app.engine.cuda.runner import CudaRunner, load_packed
from app.engine.cuda.weights import arena_nbytes, module_to_arena, weights_from_model
from app.engine.skeleton import load_skeleton
from app.errors import ModelLoadError
from app.formats.recipe import BUILTIN_RECIPES


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, qwen_tokenizer_dir) -> Path:
    """Kernel-friendly shapes, the 'mixed' recipe: W4 and W3 parts, fused q/k/v with biases."""
    from app.quant.quantizer import QuantizeJob, quantize_model
    from tests.conftest import build_tiny_model

    src = build_tiny_model(tmp_path_factory.mktemp("tiny-src"), qwen_tokenizer_dir, "qwen2", hidden_size=128,
                           intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, seed=3)
    out = tmp_path_factory.mktemp("tiny-mixed")
    quantize_model(QuantizeJob(src, out, BUILTIN_RECIPES["mixed"], method="rtn"))
    return out


def module_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    named = {f"{prefix}.{name}" if prefix else name: t for prefix, m in model.named_modules()
             for store in (m._parameters, m._buffers) for name, t in store.items() if t is not None}
    return {name: t for name, t in named.items() if not name.startswith("rope_")}


def streamed(path: Path, progress=None):
    skeleton = load_skeleton(path, max_context=64)
    assert all(t.is_meta for t in module_tensors(skeleton.loaded.model).values())
    arena = module_to_arena(skeleton.loaded.model, torch.device("cpu"))
    skeleton.fill(progress)
    return skeleton, arena


@pytest.mark.parametrize("kind", ["checkpoint", "folder"])
def test_streamed_weights_equal_the_in_memory_load(kind, tiny_checkpoint, tiny_qwen_kernel_dir):
    path = tiny_checkpoint if kind == "checkpoint" else tiny_qwen_kernel_dir
    skeleton, arena = streamed(path)
    want = module_tensors(load_packed(path, max_context=64).model)
    got = module_tensors(skeleton.loaded.model)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
        # every tensor is a view of the one allocation
        assert got[name].untyped_storage().data_ptr() == arena.untyped_storage().data_ptr(), name


def test_the_plan_is_made_from_shapes_alone(tiny_checkpoint):
    skeleton = load_skeleton(tiny_checkpoint, max_context=64)
    meta = weights_from_model(skeleton.loaded.model)
    in_memory = weights_from_model(load_packed(tiny_checkpoint, max_context=64).model)
    assert [w.bits for w in (meta.layers[0].qkv, meta.layers[0].down, meta.lm_head)] == [4, 3, 4]  # mixed: 4-bit head
    assert meta.nbytes == in_memory.nbytes
    tensors = list(module_tensors(skeleton.loaded.model).values())
    assert arena_nbytes(tensors) >= meta.nbytes


def test_runner_over_streamed_weights_equals_the_in_memory_one(tiny_checkpoint):
    skeleton, _ = streamed(tiny_checkpoint)
    loaded = load_packed(tiny_checkpoint, max_context=64)
    prompt = loaded.tokenizer.encode("Hello, streamed world")
    ours = CudaRunner(weights_from_model(skeleton.loaded.model), num_slots=1, max_context=64)
    theirs = CudaRunner(weights_from_model(loaded.model), num_slots=1, max_context=64)
    assert torch.equal(ours.prefill(0, prompt, 0), theirs.prefill(0, prompt, 0))


def test_fill_reports_layers(tiny_checkpoint):
    seen = []
    streamed(tiny_checkpoint, lambda stage, done, total: seen.append((stage, done, total)))
    assert seen[-1] == ("layers", 2, 2) and all(stage == "layers" and total == 2 for stage, _, total in seen)
    assert [done for _, done, _ in seen] == sorted(done for _, done, _ in seen)


def test_filling_before_placing_is_refused(tiny_checkpoint):
    skeleton = load_skeleton(tiny_checkpoint, max_context=64)
    with pytest.raises(RuntimeError, match="place"):
        skeleton.fill()


def test_a_changed_checkpoint_file_is_refused_before_anything_is_placed(tiny_checkpoint, tmp_path):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, copy)
    layer = copy / "layer_000.safetensors"
    layer.write_bytes(layer.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ModelLoadError, match="layer_000.safetensors"):
        load_skeleton(copy, max_context=64)


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_skeleton(tmp_path / "nowhere")
