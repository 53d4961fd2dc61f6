"""Chunked prefill: a short request that arrives while a long prompt is being prefilled is
served between the long prompt's chunks, and both give exactly the tokens they give alone.

On the reference runner (TorchRunner, CPU) and on the CudaRunner: on the CPU (ReferenceOps)
and, marked ``gpu``, on CUDA (graphs, steps launched ahead). The runner's ``prefill`` is
wrapped to see the order of the chunks and to hold the long prompt after its first chunk
until the short request has been submitted, so the arrival lands mid-prefill every time.
"""

from __future__ import annotations

import threading

import pytest
import torch

from app.engine import PRIORITY_BACKGROUND, Engine, SamplingParams
from app.engine.cuda.memory import QWEN25_3B_CONFIG
from app.engine.kv_cache import StaticKVCache
from app.engine.runner import CPU_PREFILL_CHUNK_RANGE, GPU_PREFILL_CHUNK, TorchRunner, cpu_prefill_chunk
from app.formats.spec import ModelSpec

CHUNK = 32  # tokens per prefill step in these tests: the long prompt takes 10 steps
CONTEXT = 512
LONG_PROMPT = [(7 * i) % 5000 + 100 for i in range(300)]
SHORT_PROMPT = [11, 12, 13, 14]
RUNNERS = ["torch", "cuda-runner-cpu", pytest.param("cuda-runner-cuda", marks=pytest.mark.gpu)]


def build_engine(kind: str, tiny_qwen_dir, tiny_qwen_kernel_dir, slots: int = 2) -> Engine:
    """An engine with ``slots`` slots whose runner prefills CHUNK tokens per step."""
    from app.engine.cuda.runner import CudaRunner
    from app.engine.cuda.weights import weights_from_model

    folder = tiny_qwen_dir if kind == "torch" else tiny_qwen_kernel_dir
    with Engine.load(folder, device="cpu", max_batch_size=slots, max_context=CONTEXT) as reference:
        loaded = reference.loaded
    if kind == "torch":
        cache = StaticKVCache(loaded.spec, slots, CONTEXT, loaded.dtype, torch.device("cpu"))
        runner = TorchRunner(loaded.model, cache, torch.device("cpu"), prefill_chunk=CHUNK)
    else:
        device = "cuda" if kind == "cuda-runner-cuda" else "cpu"
        weights = weights_from_model(loaded.model).map_tensors(lambda t: t.half().to(device))
        runner = CudaRunner(weights, num_slots=slots, max_context=CONTEXT, prefill_chunk=CHUNK)
    return Engine(loaded, runner, slots)


class HeldPrefill:
    """Wraps ``runner.prefill``: records each chunk (slot, start, length, whether ``short`` was
    done then) and, while armed, holds the scheduler after the first chunk of a prompt until
    :meth:`release`."""

    def __init__(self, runner):
        self.chunks: list[tuple[int, int, int, bool]] = []
        self.short = None  # the short request's Generation, once submitted
        self.armed = False
        self.first_chunk_done, self.released = threading.Event(), threading.Event()
        self._prefill = runner.prefill
        runner.prefill = self.prefill

    def prefill(self, slot: int, ids: list[int], start: int):
        self.chunks.append((slot, start, len(ids), self.short is not None and self.short.done))
        logits = self._prefill(slot, ids, start)
        if self.armed and start == 0:
            self.armed = False
            self.first_chunk_done.set()
            assert self.released.wait(60), "the test never released the held prefill"
        return logits

    def release(self) -> None:
        self.released.set()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("kind", RUNNERS)
def test_a_short_request_is_served_between_a_long_prompts_chunks(kind, tiny_qwen_dir, tiny_qwen_kernel_dir):
    with build_engine(kind, tiny_qwen_dir, tiny_qwen_kernel_dir) as engine:
        held = HeldPrefill(engine.runner)
        sampled = SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
        long_alone = engine.generate(LONG_PROMPT, greedy(6), PRIORITY_BACKGROUND).wait(120)
        short_alone = engine.generate(SHORT_PROMPT, sampled, PRIORITY_BACKGROUND).wait(60)
        held.chunks.clear()
        held.armed = True
        long = engine.generate(LONG_PROMPT, greedy(6), PRIORITY_BACKGROUND)
        assert held.first_chunk_done.wait(60)
        held.short = engine.generate(SHORT_PROMPT, sampled, PRIORITY_BACKGROUND)  # same priority, as the server's
        held.release()
        short_result, long_result = held.short.wait(60), long.wait(120)
    long_chunks = [c for c in held.chunks if c[0] == 0]
    # The long prompt is cut every CHUNK tokens from its start, as alone ...
    assert [(start, n) for _, start, n, _ in long_chunks] == [(s, min(CHUNK, len(LONG_PROMPT) - s))
                                                              for s in range(0, len(LONG_PROMPT), CHUNK)]
    # ... the short request was prefilled right after its first chunk, and had all its tokens
    # before the long prompt's last chunk ran (it did not wait for the whole prefill) ...
    assert held.chunks[1] == (1, 0, len(SHORT_PROMPT), False)
    assert long_chunks[-1][3], "the short request waited for the whole long prefill"
    # ... and both give the tokens they give alone.
    assert long_result.token_ids == long_alone.token_ids and long_result.text == long_alone.text
    assert short_result.token_ids == short_alone.token_ids and short_result.text == short_alone.text


def test_one_step_prefills_several_short_prompts_within_the_chunk(tiny_qwen_dir, tiny_qwen_kernel_dir):
    """Prompts waiting together share a step while their chunks fit in CHUNK tokens, the
    fewest tokens left first; each still gives its tokens alone."""
    prompts = [list(range(200, 200 + n)) for n in (40, 9, 12)]  # 40 > CHUNK: two chunks
    with build_engine("torch", tiny_qwen_dir, tiny_qwen_kernel_dir, slots=3) as engine:
        alone = [engine.generate(p, greedy(3)).wait(60).token_ids for p in prompts]
        held = HeldPrefill(engine.runner)
        steps = held.chunks  # prefills as (slot, start, length, _), decode steps as their slots
        decode = engine.runner.decode
        engine.runner.decode = lambda slots, ids, positions: steps.append(tuple(slots)) or decode(slots, ids, positions)
        held.armed = True
        blocker = engine.generate([5, 6, 7, 8, 9], greedy(1))  # holds the scheduler while the others queue
        assert held.first_chunk_done.wait(60)
        handles = [engine.generate(p, greedy(3)) for p in prompts]
        held.release()
        together = [h.wait(60).token_ids for h in handles]
        blocker.wait(60)
    assert together == alone
    # slots 0, 1, 2 hold the prompts of 40, 9 and 12 tokens: one step prefills the 9 and the
    # 12 (21 of 32 tokens; the 40's first 32 do not fit) and decodes them, the next steps
    # prefill the 40 in two chunks while the short ones decode to their end
    assert steps == [(0, 0, 5, False),
                     (1, 0, 9, False), (2, 0, 12, False), (1, 2),
                     (0, 0, 32, False), (1, 2),
                     (0, 32, 8, False), (0,),
                     (0,)]


def test_the_cpu_chunk_is_sized_to_the_model(starter_model_dir, tiny_qwen_dir):
    """A CPU chunk is a fraction of a second of work on a slow laptop: 64 tokens of the starter
    model (SmolLM2-135M), the floor for a 3B model, the cap for a tiny one."""
    starter = ModelSpec.from_hf_folder(starter_model_dir)
    qwen_3b = ModelSpec.from_hf_config({"architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 32768,
                                        "rms_norm_eps": 1e-6, **{k: v for k, v in QWEN25_3B_CONFIG.items()
                                                                  if k != "model_type"}})
    assert cpu_prefill_chunk(starter) == 64
    assert cpu_prefill_chunk(qwen_3b) == CPU_PREFILL_CHUNK_RANGE[0]
    assert cpu_prefill_chunk(ModelSpec.from_hf_folder(tiny_qwen_dir)) == CPU_PREFILL_CHUNK_RANGE[1]
    with Engine.load(starter_model_dir, device="cpu", max_batch_size=1, max_context=256) as engine:
        assert engine.runner.capabilities.prefill_chunk == 64
        assert engine._scheduler.prefill_chunk == 64
    assert GPU_PREFILL_CHUNK == 512
