"""The Runner contract (app.engine.runner): both runners implement every call of the protocol,
each optional ability is granted or declined in ``capabilities`` (decided when the runner is
built, from its RunnerOptions), and the scheduler uses only what a runner grants."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from app.engine import Engine, SamplingParams
from app.engine.cuda.runner import ONE_SLOT_ROWS, CudaRunner
from app.engine.runner import (
    GPU_PREFILL_CHUNK, Runner, RunnerCapabilities, RunnerOptions, TorchRunner, cpu_prefill_chunk,
)
from app.kernels.gemv import GemvOptions

PIPELINED = ("set_sampling", "decode_tokens", "decode_tokens_launch", "decode_tokens_launch_next",
             "decode_tokens_collect", "decode_tokens_in_flight")
VERIFY = ("tokens_rows", "logits_rows")


def protocol_methods() -> set[str]:
    return {name for name, member in vars(Runner).items() if inspect.isfunction(member) and not name.startswith("_")}


def test_the_protocol_declares_what_the_scheduler_calls():
    assert protocol_methods() == {"prefill", "decode", "memory_info", "close", *PIPELINED, *VERIFY}
    assert {"device", "max_context", "num_slots", "capabilities"} <= set(Runner.__annotations__)


@pytest.mark.parametrize("runner_type", [TorchRunner, CudaRunner])
def test_both_runners_implement_every_call(runner_type):
    for name in protocol_methods():
        own = getattr(runner_type, name, None)
        assert callable(own), f"{runner_type.__name__}.{name}"
        assert list(inspect.signature(own).parameters) == list(inspect.signature(getattr(Runner, name)).parameters), name


def test_the_reference_runner_declines_every_optional_ability(tiny_qwen_dir):
    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1, max_context=64) as engine:
        runner = engine.runner
        assert isinstance(runner, TorchRunner)
        assert runner.capabilities == RunnerCapabilities(pipelined_decode=False, draw_on_device=False,
                                                         max_verify_rows=1,
                                                         prefill_chunk=cpu_prefill_chunk(runner.model.spec))
        calls = {"set_sampling": (0, None), "decode_tokens": ([0], [1], [0]), "decode_tokens_launch": ([0], [1], [0]),
                 "decode_tokens_launch_next": (), "decode_tokens_collect": (), "decode_tokens_in_flight": (),
                 "tokens_rows": (0, [1, 2], 0), "logits_rows": (0, [1, 2], 0)}
        for name, args in calls.items():
            capability = "pipelined_decode" if name in PIPELINED else "verify rows"
            with pytest.raises(NotImplementedError, match=f"TorchRunner declines {capability}"):
                getattr(runner, name)(*args)
        runner.close()  # nothing to free; the engine closes it again


def test_the_scheduler_uses_only_what_the_reference_runner_grants(tiny_qwen_dir):
    """Greedy, sampled and penalized requests together on the reference runner: each one would
    fail if the scheduler called a declined method (they raise)."""
    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=3, max_context=96, lookup_draft=7) as engine:
        assert engine._scheduler.max_draft == 0  # no rows to check guesses with: nothing is guessed
        params = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                  SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True),
                  SamplingParams(max_tokens=8, temperature=0, repetition_penalty=1.1, ignore_eos=True)]
        handles = [engine.complete("The cat sat on the", p) for p in params]
        results = [h.wait(60) for h in handles]
    assert [len(r.token_ids) for r in results] == [8, 8, 8]
    assert all(r.finish_reason == "length" for r in results)


def tiny_cuda_runner(options: RunnerOptions | None = None, slots: int = 2) -> CudaRunner:
    from test_cuda_runtime import random_model, runtime_weights, tiny_spec

    weights = runtime_weights(random_model(tiny_spec(), seed=5), "w4")
    return CudaRunner(weights, num_slots=slots, max_context=64, options=options)


def test_the_cuda_runner_grants_each_ability_as_its_options_say():
    runner = tiny_cuda_runner()
    assert runner.options == RunnerOptions()
    assert runner.capabilities == RunnerCapabilities(pipelined_decode=True, draw_on_device=True,
                                                     max_verify_rows=min(runner.buffers.rows, ONE_SLOT_ROWS),
                                                     prefill_chunk=GPU_PREFILL_CHUNK)
    assert runner.max_verify_rows == runner.capabilities.max_verify_rows > 1
    on_host = tiny_cuda_runner(RunnerOptions(draw_on_device=False))
    assert on_host.capabilities.pipelined_decode and not on_host.capabilities.draw_on_device


def test_the_options_reach_the_decode_step():
    options = RunnerOptions(fuse_norms=False, fuse_rope=False, gemv=GemvOptions(stage_x_bytes=0, preload_weights=False))
    runner = tiny_cuda_runner(options)
    assert runner.step.options is options
    assert runner.step.fused_norm_sites(1) == frozenset()  # fusable shapes, fusion switched off
    assert tiny_cuda_runner().step.fused_norm_sites(1)  # ... and on by default
    with pytest.raises(dataclasses.FrozenInstanceError):  # a runner's options cannot change under it
        options.fuse_rope = True


def test_capabilities_refuse_a_device_draw_without_device_steps():
    with pytest.raises(ValueError, match="draw_on_device needs pipelined_decode"):
        RunnerCapabilities(pipelined_decode=False, draw_on_device=True)
    with pytest.raises(ValueError, match="max_verify_rows"):
        RunnerCapabilities(max_verify_rows=0)


def test_an_engine_passes_its_runner_options_on_to_the_scheduler(engine_on):
    """Sampled requests on a runner that draws on the host: their tokens never go through the
    device steps (set_sampling is never called with a sampled row)."""
    seen = []
    with engine_on("cpu", 0, 1, options=RunnerOptions(draw_on_device=False)) as engine:
        set_sampling = engine.runner.set_sampling
        engine.runner.set_sampling = lambda slot, row: seen.append(row) or set_sampling(slot, row)
        greedy = engine.generate([1, 2, 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
        sampled = engine.generate([4, 5, 6], SamplingParams(max_tokens=4, temperature=0.7, seed=2, ignore_eos=True))
        assert len(greedy.wait(60).token_ids) == len(sampled.wait(60).token_ids) == 4
    assert all(row is None or row.temperature == 0 for row in seen)
