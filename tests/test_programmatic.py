"""Programmatic dependent launch (app.kernels.programmatic): the driver structures, the mode,
every kernel's wait, and on an SM90+ GPU bit-equality with plain launches (a kernel that read
its input before the previous kernel finished would give different numbers)."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
import torch

from app.kernels import loader, programmatic
from app.kernels.errors import KernelArgumentError, KernelError
from app.kernels.loader import KERNEL_DIR


@pytest.fixture(autouse=True)
def default_mode(monkeypatch):
    monkeypatch.delenv(programmatic.ENV_VAR, raising=False)
    programmatic.set_mode(None)
    yield
    programmatic.set_mode(None)


def test_structures_have_the_layout_of_cuda_h():
    # CUlaunchAttribute: id, 4 bytes of padding, a 64-byte union; CUlaunchConfig: 7 uints, then
    # the stream handle 8-aligned, the attribute pointer and their count.
    assert ctypes.sizeof(programmatic._LaunchAttribute) == 72
    assert programmatic._LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(programmatic._LaunchConfig) == 56
    offsets = {name: getattr(programmatic._LaunchConfig, name).offset for name in ("stream", "attrs", "num_attrs")}
    assert offsets == {"stream": 32, "attrs": 40, "num_attrs": 48}


def test_launch_config_sets_the_serialization_attribute_and_pads_dimensions():
    config = programmatic.launch_config((7, 2), (128,), 64, 0xABC)
    assert (config.grid_x, config.grid_y, config.grid_z) == (7, 2, 1)
    assert (config.block_x, config.block_y, config.block_z) == (128, 1, 1)
    assert config.shared_mem_bytes == 64 and config.stream == 0xABC and config.num_attrs == 1
    attr = config.attrs[0]
    assert attr.id == programmatic.ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION == 6
    assert ctypes.c_int.from_buffer(attr.value).value == 1  # programmaticStreamSerializationAllowed


def test_arguments_are_packed_into_8_byte_slots_with_their_c_types():
    args = (0x7F00_0000_1000, 0, np.int32(-3), np.int64(1 << 40), np.float32(0.5))
    values = (ctypes.c_uint64 * len(args))(*([0xFFFF_FFFF_FFFF_FFFF] * len(args)))  # junk to overwrite
    programmatic.pack_arguments(args, values)
    raw = bytes(values)
    assert int.from_bytes(raw[0:8], "little") == 0x7F00_0000_1000
    assert int.from_bytes(raw[8:16], "little") == 0
    assert ctypes.c_int32.from_buffer_copy(raw[16:20]).value == -3  # what the kernel's int reads
    assert ctypes.c_int64.from_buffer_copy(raw[24:32]).value == 1 << 40
    assert ctypes.c_float.from_buffer_copy(raw[32:36]).value == 0.5
    scratch_values, params, _ = programmatic._scratch.buffers(3)  # the parameter array points at the slots
    assert [params[i] for i in range(3)] == [ctypes.addressof(scratch_values) + 8 * i for i in range(3)]
    for bad in (1.5, True, "x", np.float64(1.0)):
        with pytest.raises(KernelArgumentError, match="kernel argument 1"):
            programmatic.pack_arguments((0, bad), values)


def test_mode_comes_from_set_mode_then_the_environment(monkeypatch):
    assert programmatic.mode() == "auto"
    monkeypatch.setenv(programmatic.ENV_VAR, "OFF")
    assert programmatic.mode() == "off"
    programmatic.set_mode("on")
    assert programmatic.mode() == "on"
    with pytest.raises(KernelArgumentError, match="must be one of auto, on, off"):
        programmatic.set_mode("yes")
    programmatic.set_mode(None)
    monkeypatch.setenv(programmatic.ENV_VAR, "sometimes")
    with pytest.raises(KernelError, match="QWEN_TRAY_PDL='sometimes'"):
        programmatic.mode()


def test_sm86_launches_stay_plain_and_on_is_refused_there():
    assert not programmatic.enabled((8, 6))  # auto: the RTX 3050's default path is unchanged
    assert programmatic.unsupported_reason((8, 6)) == "compute capability 8.6 < 9.0"
    # an SM90 GPU with a driver whose graphs cannot hold programmatic edges stays plain too
    assert programmatic.unsupported_reason((9, 0), driver_version=12020) == (
        "the CUDA driver supports CUDA 12.2; CUDA graphs need 12.3 for programmatic launches")
    programmatic.set_mode("off")
    assert not programmatic.enabled((9, 0))
    programmatic.set_mode("on")
    with pytest.raises(KernelError, match="QWEN_TRAY_PDL=on.*8.6 < 9.0"):
        programmatic.enabled((8, 6))


def kernel_bodies() -> dict[str, str]:
    """Each __global__ function's text (up to the next one) in app/kernels/*.cu."""
    bodies = {}
    for path in sorted(KERNEL_DIR.glob("*.cu")):
        parts = re.split(r"__global__", path.read_text(encoding="utf-8"))
        for part in parts[1:]:
            name = re.search(r"(\w+_kernel)\s*\(", part).group(1)
            bodies[f"{path.name}:{name}"] = part
    return bodies


def test_every_kernel_triggers_its_dependents_and_waits_before_dependent_work():
    bodies = kernel_bodies()
    # gemv, norm, rope, attention split + combine, dequant W4 + W3, argmax part + final,
    # the draw's part, pick, search and filtered pick, the load-time W3 + W4 tile repacks
    assert len(bodies) == 15
    for name, body in bodies.items():
        trigger, wait = body.find("pdl_launch_dependents();"), body.find("pdl_wait();")
        assert trigger >= 0 and wait > trigger, f"{name}: needs pdl_launch_dependents() then pdl_wait()"


# -- GPU (SM90+: the only GPUs where launches are programmatic) ---------------------------------

def needs_programmatic_gpu():
    if not loader.available():
        pytest.skip(loader.unavailable_reason())
    capability = torch.cuda.get_device_capability()
    reason = programmatic.unsupported_reason(capability)
    if reason is not None:
        pytest.skip(f"programmatic launches do not apply here: {reason}")


def dependent_chain(x, layers, out):
    """norm -> W4 GEMV (+ residual) -> norm -> W3 gate/up -> W4 down (+ residual), per layer:
    every kernel reads what the one before it just wrote."""
    from app import kernels

    h, normed, act = out
    h.copy_(x)
    for norm_w, w_o, gate_up, down in layers:
        kernels.rms_norm(h, norm_w, 1e-6, out=normed)
        kernels.gemv_w4(normed, *w_o, residual=h, out=h)
        kernels.rms_norm(h, norm_w, 1e-6, out=normed)
        kernels.gate_up_silu_w3(normed, *gate_up, out=act)
        kernels.gemv_w4(act, *down, residual=h, out=h)
    return h


@pytest.mark.gpu
@pytest.mark.parametrize("graphed", [False, True])
def test_programmatic_launches_are_bit_equal_to_plain_ones(graphed):
    needs_programmatic_gpu()
    from tests.test_kernels_gpu import weights

    hidden, inter, batch, layers = 1024, 2816, 3, 12
    g = torch.Generator(device="cuda").manual_seed(3)
    stack = [((torch.rand(hidden, generator=g, device="cuda") + 0.5).half(), weights(4, hidden, hidden, 10 * i),
              weights(3, 2 * inter, hidden, 10 * i + 1), weights(4, hidden, inter, 10 * i + 2))
             for i in range(layers)]
    x = torch.randn(batch, hidden, generator=g, device="cuda").half()
    results = {}
    for mode in ("off", "on"):
        programmatic.set_mode(mode)
        out = (torch.full((batch, hidden), float("nan"), dtype=torch.float16, device="cuda"),
               torch.empty(batch, hidden, dtype=torch.float16, device="cuda"),
               torch.empty(batch, inter, dtype=torch.float16, device="cuda"))
        if graphed:
            dependent_chain(x, stack, out)  # compile, warm
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                dependent_chain(x, stack, out)
            for _ in range(3):
                graph.replay()
        else:
            for _ in range(3):
                dependent_chain(x, stack, out)
        torch.cuda.synchronize()
        results[mode] = out[0].clone()
    assert torch.isfinite(results["on"]).all()
    assert torch.equal(results["on"], results["off"])


@pytest.mark.gpu
def test_runner_decode_with_programmatic_launches_equals_plain_launches():
    needs_programmatic_gpu()
    from tests.test_cuda_runtime import gpu_runner, random_model, runtime_weights, tiny_spec

    weights = runtime_weights(random_model(tiny_spec(), seed=9), "mixed")
    logits = {}
    for mode in ("off", "on"):
        programmatic.set_mode(mode)  # the decode graphs capture the mode in force
        runner = gpu_runner(weights, num_slots=2, max_context=128, prefill_mode="gemm")
        steps = [runner.prefill(0, [5, 6, 7, 8, 9], 0)]
        tokens, pos = [3], [5]
        for _ in range(20):
            step = runner.decode([0], tokens, pos)
            steps.append(step)
            tokens, pos = step.argmax(-1).tolist(), [pos[0] + 1]
        logits[mode] = torch.stack([s.reshape(-1).float().cpu() for s in steps])
        runner.close()
    assert torch.equal(logits["on"], logits["off"])
