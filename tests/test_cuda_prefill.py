"""The first prefill chunk padded to a token bucket (app.engine.cuda.prefill_graphs).

CPU: the padded path runs eagerly with ReferenceOps and is compared with the unpadded eager
path on the same runner. Bounds (CPU, fp16 activations): ||Δlogits|| / ||logits|| < 2e-3
with the same argmax, and the real positions' KV rows within 2e-3 relative. Measured: 0
when T is a bucket edge (the linears' rows do not depend on how many rows follow), up to
~8e-4 for T = 17 on Qwen2 (padded to 32: PyTorch's CPU SDPA blocks the keys by sequence
length, so the summation order differs). Exact: positions past the prompt keep what they
held (NaN here, which must not reach a real row), other slots are untouched.

GPU (``-m gpu``): graph replay against the eager unpadded prefill, where cuBLAS may pick
another algorithm for the padded M: ||Δlogits|| / ||logits|| < 5e-3 with the same argmax,
KV rows within 5e-3 relative per layer; against the same padded path run eagerly, < 1e-3
(the same launches; cuBLAS may still choose differently under capture).
"""

from __future__ import annotations

import gc
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from app.engine.cuda import prefill as prefill_mod
from app.engine.cuda.memory import (
    GiB, MIN_TILE_ELEMENTS, RTX_3050_LAPTOP, GpuInfo, VramBudgetError, parse_size, plan_memory, prefill_activation_bytes,
    prefill_gemm_bytes,
)
from app.engine.cuda.prefill import causal_attention, gathered_attention, grouped_attention
from app.engine.cuda.prefill_graphs import prefill_buckets
from app.engine.cuda.runner import CudaRunner
from app.engine.kv_cache import StaticKVCache
from app.engine.runner import TorchRunner
from tests.test_cuda_runtime import (
    LOGITS_BOUND, QWEN3B, QWEN7B, compare_with_reference, gpu_runner, plan, random_model, rel, runtime_weights, tiny_spec,
)

CPU_BOUND = 2e-3
GPU_EAGER_BOUND = 5e-3
GPU_PADDED_BOUND = 1e-3
CHUNK, CONTEXT, SLOTS = 32, 128, 3


def prompt(n: int, seed: int = 7) -> list[int]:
    return torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cpu_runner(arch: str, recipe: str | None, chunk: int = CHUNK) -> CudaRunner:
    """Eager runner (ReferenceOps), GEMM prefill in ``chunk``-token chunks, small weight tiles."""
    spec = tiny_spec(arch)
    weights = runtime_weights(random_model(spec, seed=3), recipe)
    p = plan_memory(spec, weights.nbytes, num_slots=SLOTS, max_context=CONTEXT, budget_bytes=GiB,
                    gpu=RTX_3050_LAPTOP)
    p = replace(p, prefill_chunk=chunk, tile_elements=MIN_TILE_ELEMENTS)
    runner = CudaRunner(weights, num_slots=SLOTS, max_context=CONTEXT, plan=p, use_graphs=False)
    runner.gemm.tile = runner.gemm.tile[: 100 * 384]  # 96-row tiles: several per weight
    assert runner.prefill_graphs.buckets == prefill_buckets(chunk, CONTEXT) and not runner.padded_prefill
    return runner


def poison(runner: CudaRunner, slot: int) -> None:
    """NaN everywhere in ``slot``: stale rows that a real row must never read."""
    runner.cache.k[:, slot].fill_(float("nan"))
    runner.cache.v[:, slot].fill_(float("nan"))


def kv_rows(runner: CudaRunner, slot: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return runner.cache.k[:, slot, :, :n].clone(), runner.cache.v[:, slot, :, :n].clone()


@pytest.mark.parametrize("arch,recipe", [("qwen2", None), ("qwen2", "mixed"), ("llama", "w4")])
@pytest.mark.parametrize("n", [1, 16, 17, CHUNK])
def test_padded_first_chunk_equals_unpadded_on_cpu(arch, recipe, n):
    runner = cpu_runner(arch, recipe)
    ids = prompt(n)
    poison(runner, 0)
    runner.cache.k[:, 1].normal_()
    runner.cache.v[:, 2].normal_()
    others = [t[:, s].clone() for t in (runner.cache.k, runner.cache.v) for s in (1, 2)]
    runner.padded_prefill = True
    padded = runner.prefill(0, ids, 0)
    assert torch.isfinite(padded).all()
    assert torch.isnan(runner.cache.k[:, 0, :, n:]).all() and torch.isnan(runner.cache.v[:, 0, :, n:]).all()
    assert all(torch.equal(a, t[:, s]) for a, (t, s) in zip(others, [(t, s) for t in (runner.cache.k, runner.cache.v)
                                                                   for s in (1, 2)]))
    runner.padded_prefill = False
    unpadded = runner.prefill(2, ids, 0)
    kv = max(rel(got, want) for got, want in zip(kv_rows(runner, 0, n), kv_rows(runner, 2, n)))
    print(f"{arch} {recipe} T={n}: rel logits {rel(padded, unpadded):.1e}, KV rows {kv:.1e}")
    assert rel(padded, unpadded) < CPU_BOUND and int(padded.argmax()) == int(unpadded.argmax())
    assert kv < CPU_BOUND


def test_long_prompt_first_chunk_padded_rest_eager_matches_reference():
    spec = tiny_spec("llama")
    model = random_model(spec, seed=3)
    runner = cpu_runner("llama", "w4")
    runner.padded_prefill = True
    calls = []
    for name in ("prefill_graphs", "gemm"):
        part = getattr(runner, name)
        part.run = lambda *a, _f=part.run, _n=name: calls.append((_n, len(a[1]), a[2:])) or _f(*a)
    ref = TorchRunner(model, StaticKVCache(spec, SLOTS, CONTEXT, torch.float32, "cpu"), torch.device("cpu"))
    runtime_weights(model, "w4")  # the reference gets the dequantized weights
    assert compare_with_reference(runner, ref, prompt(45), steps=4, slot=1) < LOGITS_BOUND
    assert calls == [("prefill_graphs", CHUNK, ()), ("gemm", 45 - CHUNK, (CHUNK,))]


def test_a_chunk_after_the_first_runs_eagerly():
    runner = cpu_runner("qwen2", "w4")
    runner.padded_prefill = True
    ids = prompt(40)
    runner.prefill(0, ids[:20], 0)
    runner.prefill_graphs.run = lambda *a: pytest.fail("start > 0 must not take the padded path")
    split = runner.prefill(0, ids[20:], 20)
    runner.padded_prefill = False
    assert rel(split, runner.prefill(1, ids, 0)) < CPU_BOUND


def test_buckets():
    assert prefill_buckets(512, 4096) == [16, 32, 64, 128, 256, 512]
    assert prefill_buckets(256, 4096) == [16, 32, 64, 128, 256]
    assert prefill_buckets(512, 100) == [16, 32, 64, 100]  # pads stay inside the cache
    assert prefill_buckets(16, 128) == [16]
    runner = cpu_runner("qwen2", "w4")
    assert [runner.prefill_graphs.bucket_for(n) for n in (1, 16, 17, 32)] == [16, 16, 32, 32]
    with pytest.raises(ValueError):
        runner.prefill_graphs.bucket_for(33)


@pytest.mark.parametrize("gqa", [True, False])
def test_gathered_attention_equals_slot_attention(monkeypatch, gqa):
    """One SDPA call with enable_gqa (torch >= 2.5) or the per-group loop; rows gathered by index."""
    if gqa and not prefill_mod.SDPA_GQA:
        pytest.skip("torch < 2.5: no enable_gqa")
    monkeypatch.setattr(prefill_mod, "SDPA_GQA", gqa)
    g = torch.Generator().manual_seed(1)
    slots, hkv, length, d, t, hq = 3, 2, 40, 64, 24, 8
    k, v = (torch.randn(slots, hkv, length, d, generator=g).half() for _ in range(2))
    q = torch.randn(t, hq, d, generator=g).half()
    want = causal_attention(q, k[2], v[2], 0)
    rows = ((2 * hkv + torch.arange(hkv)[:, None]) * length + torch.arange(t)[None]).flatten().int()  # [Hkv*T]
    assert torch.equal(gathered_attention(q, k, v, rows), want)
    monkeypatch.setattr(prefill_mod, "SDPA_GQA", False)
    keys, values = k[2, :, :t][None], v[2, :, :t][None]  # [1, Hkv, T, D]
    assert rel(grouped_attention(q, keys, values), want) < CPU_BOUND


def test_later_chunk_one_call_wiring_matches_the_masked_group_loop(monkeypatch):
    """The one-call path (taken where flash attention runs it) forced on the CPU, where SDPA's
    math backend computes the same bottom-right causal mask: shapes and head order."""
    if not prefill_mod.SDPA_GQA:
        pytest.skip("torch < 2.5: no enable_gqa")
    g = torch.Generator().manual_seed(4)
    hq, hkv, d, start, t, length = 8, 2, 64, 30, 12, 64
    k, v = (torch.randn(hkv, length, d, generator=g) for _ in range(2))
    q = torch.randn(t, hq, d, generator=g)
    want = causal_attention(q, k, v, start)  # the CPU never takes flash: the masked loop
    monkeypatch.setattr(prefill_mod, "flash_takes_gqa", lambda *a: True)
    got = causal_attention(q, k, v, start)
    assert got.shape == (t, hq * d) and rel(got, want) < 1e-5


def test_a_torch_without_enable_gqa_in_sdpa_params_keeps_the_group_loop(monkeypatch):
    """SDPAParams is private API: one whose constructor predates enable_gqa means no one-call path."""
    def old_params(query, key, value, attn_mask, dropout, is_causal):  # the six-argument form
        raise AssertionError("not reached: seven arguments are passed")

    monkeypatch.setattr(prefill_mod, "SDPA_GQA", True)
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", old_params)
    on_gpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert prefill_mod.flash_takes_gqa(on_gpu, on_gpu, on_gpu) is False


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv,d", [(16, 2, 128), (28, 4, 128), (14, 2, 64)])
def test_gpu_later_chunk_in_one_flash_call_matches_the_masked_group_loop(hq, hkv, d, monkeypatch):
    """A chunk at start > 0: one flash-attention call (causal from the bottom right, GQA) against
    the per-group loop with an explicit mask. fp16 on both sides: < 2e-3 relative."""
    g = torch.Generator(device="cuda").manual_seed(5)
    start, t, length = 300, 200, 640
    k, v = (torch.randn(hkv, length, d, generator=g, device="cuda").half() for _ in range(2))
    q = torch.randn(t, hq, d, generator=g, device="cuda").half()
    heads, keys = q.transpose(0, 1)[None], k[None, :, :start + t]
    assert prefill_mod.SDPA_GQA and prefill_mod.flash_takes_gqa(heads, keys, keys)  # (else nothing is compared)
    got = causal_attention(q, k, v, start)
    monkeypatch.setattr(prefill_mod, "flash_takes_gqa", lambda *a: False)
    want = causal_attention(q, k, v, start)
    assert torch.isfinite(got).all() and rel(got, want) < CPU_BOUND


# -- the VRAM plan counts the graphs' pool -----------------------------------------------------

def test_plan_counts_the_prefill_graph_pool():
    with_graphs, without = plan(QWEN3B, "w4", 8192), plan(QWEN3B, "w4", 8192, prefill_graphs=False)
    assert with_graphs.prefill_mode == without.prefill_mode == "gemm" and without.prefill_graph_bytes == 0
    pool = with_graphs.prefill_graph_bytes
    # at least the largest bucket's activations and the PyTorch dequantizer's temporaries
    assert pool >= prefill_activation_bytes(QWEN3B, 512, with_graphs.tile_elements) + 4 * with_graphs.tile_elements
    assert with_graphs.total_bytes == without.total_bytes + pool <= parse_size("3.2GiB")
    assert with_graphs.as_dict()["planned_prefill_graph_bytes"] == pool and "graphs" in with_graphs.describe()
    # a budget with room for the eager workspace but not for the graphs too: gemm without graphs
    eager = prefill_gemm_bytes(QWEN3B, 128, 8192, MIN_TILE_ELEMENTS, RTX_3050_LAPTOP.capability, True)
    tight = without.total_bytes - without.prefill_bytes + eager + (1 << 20)
    p = plan(QWEN3B, "w4", 8192, budget=str(tight))
    assert p.prefill_mode == "gemm" and p.prefill_graph_bytes == 0 and p.total_bytes <= tight


def test_graph_prefill_mode_has_no_prefill_graphs():
    p = plan(QWEN3B, "w4", 8192, prefill_mode="graph")
    assert p.prefill_graph_bytes == 0 and p.prefill_bytes == 0
    spec = tiny_spec()
    runner = CudaRunner(runtime_weights(random_model(spec, seed=3), "w4"), num_slots=1, max_context=64,
                        prefill_mode="graph")
    assert runner.prefill_graphs is None and not runner.padded_prefill
    with pytest.raises(VramBudgetError):
        plan(QWEN3B, "w4", 8192, budget="1.8GiB", prefill_mode="gemm")


def test_graph_prefill_takes_16_rows_when_the_budget_has_room():
    laptop = plan(QWEN7B, "mixed", 4096)  # 3.2 GiB on the 16-SM card: 8 attention splits, room for 16 rows
    assert laptop.prefill_mode == "graph" and laptop.decode_rows == laptop.prefill_chunk == 16
    assert laptop.total_bytes <= parse_size("3.2GiB") and "16 tokens a replay" in laptop.describe()
    h200 = GpuInfo("H200", 140 * GiB, 139 * GiB, 132, (9, 0))  # 66 splits: bigger partials, no room left
    tight = plan(QWEN7B, "mixed", 4096, gpu=h200)
    assert tight.prefill_mode == "graph" and tight.decode_rows == tight.prefill_chunk == 8
    roomy = plan(QWEN7B, "mixed", 4096, budget="3.4GiB", gpu=h200, prefill_mode="graph")
    assert roomy.decode_rows == 16
    assert roomy.decode_bytes > tight.decode_bytes + 20 * 2**20  # the LARGE_SEGMENT margin is counted
    assert plan(QWEN3B, "w4", 8192).decode_rows == 8  # the GEMM prefill needs no wide decode rows


@pytest.mark.parametrize("recipe", ["w4", "mixed"])
def test_16_row_graph_prefill_equals_8_rows_on_cpu(recipe):
    """The same prompt through 16-token and 8-token replays of the decode step: the same cache and logits."""
    spec = tiny_spec()
    weights = runtime_weights(random_model(spec, seed=3), recipe)
    runs = []
    for budget in (None, GiB):
        p = plan_memory(spec, weights.nbytes, num_slots=1, max_context=CONTEXT, budget_bytes=budget or GiB,
                        gpu=RTX_3050_LAPTOP, prefill_mode="graph")
        if budget is None:
            p = replace(p, decode_rows=8, prefill_chunk=8)
        runner = CudaRunner(weights, num_slots=1, max_context=CONTEXT, plan=p, use_graphs=False)
        assert runner.buffers.rows == p.decode_rows
        logits = runner.prefill(0, prompt(45), 0)
        runs.append((p.decode_rows, logits, kv_rows(runner, 0, 45)))
    (rows8, logits8, kv8), (rows16, logits16, kv16) = runs
    assert (rows8, rows16) == (8, 16)
    assert rel(logits16, logits8) < 1e-3
    assert all(rel(a, b) < 1e-3 for a, b in zip(kv16, kv8))


# -- GPU: graph replay ------------------------------------------------------------------------

def gpu_pair(recipe, slots: int = 3, context: int = 640):
    weights = runtime_weights(random_model(tiny_spec(), seed=11), recipe)
    graphed = gpu_runner(weights, num_slots=slots, max_context=context, prefill_mode="gemm")
    eager = gpu_runner(weights, num_slots=slots, max_context=context, prefill_mode="gemm", use_graphs=False)
    # the load captures the largest bucket; the others are captured at their first prompt
    assert graphed.padded_prefill and sorted(graphed.prefill_graphs.graphs) == [512]
    assert not eager.padded_prefill and not eager.prefill_graphs.graphs
    return graphed, eager


def assert_close_prefill(a: CudaRunner, b: CudaRunner, slot: int, ids: list[int], bound: float) -> None:
    poison(a, slot)
    got, want = a.prefill(slot, ids, 0), b.prefill(slot, ids, 0)
    n = len(ids)
    print(f"T={n}: rel logits {rel(got, want):.1e}")
    assert rel(got, want) < bound and int(got.argmax()) == int(want.argmax())
    for layer in range(a.spec.num_layers):
        for x, y in zip(kv_rows(a, slot, n), kv_rows(b, slot, n)):
            assert rel(x[layer].cpu(), y[layer].cpu()) < bound
    assert torch.isnan(a.cache.k[:, slot, :, n:]).all() and torch.isnan(a.cache.v[:, slot, :, n:]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "w4", "mixed"])
def test_gpu_prefill_graph_replay_matches_eager(recipe):
    graphed, eager = gpu_pair(recipe)
    # 1, 17, 100: a bucket's first prompt (eager, then captured); 600: the 512 graph, then 88
    # tokens eagerly; 9, 30, 120: replays of the graphs captured at those first prompts
    for n in (1, 16, 17, 100, 512, 600, 9, 30, 120):
        assert_close_prefill(graphed, eager, 0, prompt(n, seed=n), GPU_EAGER_BOUND)
    assert sorted(graphed.prefill_graphs.graphs) == [16, 32, 128, 512]
    eager.padded_prefill = True  # the same padded path without graphs
    for n in (5, 77):
        assert_close_prefill(graphed, eager, 1, prompt(n, seed=n), GPU_PADDED_BOUND)
    graphed.close()
    eager.close()


@pytest.mark.gpu
def test_gpu_prefill_graphs_take_the_slot_as_data():
    graphed, eager = gpu_pair("w4")
    first, second = prompt(40, seed=1), prompt(50, seed=2)
    assert_close_prefill(graphed, eager, 2, first, GPU_EAGER_BOUND)
    kept = kv_rows(graphed, 2, 40)
    assert_close_prefill(graphed, eager, 0, second, GPU_EAGER_BOUND)  # the same 64 graph, another slot
    assert all(torch.equal(x, y) for x, y in zip(kept, kv_rows(graphed, 2, 40)))
    token, pos = int(graphed.prefill(1, first, 0).argmax()), 40  # decode after a replayed prefill
    a, b = graphed.decode([1], [token], [pos]), eager.decode([2], [token], [pos])
    assert rel(a, b) < GPU_EAGER_BOUND
    graphed.close()
    eager.close()


@pytest.mark.gpu
def test_gpu_prefill_graphs_stay_inside_the_plan():
    from app.engine.cuda.runner import runner_for_weights

    weights = runtime_weights(random_model(tiny_spec(), seed=12), "w4")
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_reserved()
    runner = runner_for_weights(weights, num_slots=2, max_context=1024, device=torch.device("cuda"),
                                vram_budget=parse_size("1GiB"))
    try:
        p, info = runner.plan, runner.memory_info()
        print(f"prefill graphs: {info['prefill_graph_reserved_bytes'] / 2**20:.1f} MiB reserved, "
              f"{p.prefill_graph_bytes / 2**20:.1f} MiB planned; {p.describe()}")
        assert runner.padded_prefill and 0 < info["prefill_graph_reserved_bytes"] <= p.prefill_graph_bytes
        ids = prompt(900)
        runner.prefill(0, ids, 0)  # 512 through the graph, 388 eagerly
        for n in (10, 20, 40, 100, 200, 300):  # every smaller bucket captured at its first prompt
            runner.prefill(1, ids[:n], 0)
        assert sorted(runner.prefill_graphs.graphs) == [16, 32, 64, 128, 256, 512]
        runner.decode([0, 1], [5, 6], [900, 300])
        peak = torch.cuda.max_memory_reserved() - before
        print(f"peak {peak / 2**20:.1f} MiB reserved, plan {p.total_bytes / 2**20:.1f} MiB")
        assert peak <= p.total_bytes
    finally:
        runner.close()
