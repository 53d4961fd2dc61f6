"""The CUDA runtime: VRAM planner, graph-safe dequantization, CudaRunner vs the reference model.

CPU tests run the whole CudaRunner with ReferenceOps (app.kernels.reference, the kernels'
preconditions checked) and no graphs, against TorchRunner in fp32. GPU tests
(``-m gpu``, on the device machine) run it with the kernels and CUDA graphs.

Bound for fp16 GPU/runner logits vs the fp32 reference: ||a - b|| / ||b|| < 1e-2 at every
step (measured ~1e-3: both round activations to fp16 at the same points, only the fp32
summation order and the fp16 storage of the KV cache differ). Teacher forcing keeps the two
sequences identical, so the bound holds over all 50 decode steps.
"""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
import torch

from app.engine.cuda.layout import to_kernel_layout
from app.engine.cuda.load_plan import plan_load
from app.engine.cuda.memory import (
    BESIDE_ALLOCATOR, GiB, MiB, QWEN25_3B_CONFIG, RTX_3050_LAPTOP, GpuInfo, VramBudgetError, default_budget,
    fitted_shape, model_weight_bytes, parse_size, plan_memory, resolve_budget,
)
from app.engine.cuda.runner import CudaRunner
from app.engine.cuda.synthetic import dequantized_linear, quantize_linear, quantize_weights
from app.engine.cuda.weights import (
    DequantTables, LinearWeight, ModelWeights, dequantize_rows, lookup_rows, weights_from_model,
)
from app.engine.kv_cache import StaticKVCache
from app.engine.models.decoder import DecoderModel
from app.engine.runner import TorchRunner
from app.errors import ContextLengthError
from app.formats.recipe import BUILTIN_RECIPES
from app.formats.spec import ModelSpec

LOGITS_BOUND = 1e-2


def hf_spec(**config) -> ModelSpec:
    base = dict(architectures=["Qwen2ForCausalLM"], max_position_embeddings=32768, rms_norm_eps=1e-6)
    return ModelSpec.from_hf_config(base | config)


QWEN7B = hf_spec(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                 vocab_size=152064, num_hidden_layers=28, tie_word_embeddings=False)
QWEN3B = hf_spec(**{k: v for k, v in QWEN25_3B_CONFIG.items() if k != "model_type"})


# -- planner (pure arithmetic, planned for the 4 GB RTX 3050 Laptop) ---------------------------

def plan(spec, recipe, context, budget="3.2GiB", slots=1, gpu=RTX_3050_LAPTOP, **kw):
    return plan_memory(spec, model_weight_bytes(spec, recipe), num_slots=slots, max_context=context,
                       budget_bytes=parse_size(budget), gpu=gpu, torch_dequant=True, **kw)


def test_qwen7b_mixed_with_4096_context_fits_3_2_gib():
    p = plan(QWEN7B, "mixed", 4096)
    assert p.total_bytes <= parse_size("3.2GiB")
    assert p.kv_cache_bytes == 28 * 2 * 4 * 128 * 2 * 4096  # layers x (k, v) x kv heads x head dim x fp16
    assert p.weights_bytes > 2.9 * GiB
    # no room for a 512-token GEMM workspace next to 2.93 GiB of weights: prefill through the graph
    assert p.prefill_mode == "graph" and p.prefill_bytes == 0


def test_qwen3b_w4_with_8192_context_fits_and_gets_a_gemm_prefill():
    p = plan(QWEN3B, "w4", 8192)
    assert p.total_bytes <= parse_size("3.2GiB")
    assert p.prefill_mode == "gemm" and p.prefill_chunk == 512 and p.tile_elements >= 1 << 20
    assert p.headroom_bytes >= (p.budget_bytes - p.total_bytes) >= 0


def test_qwen7b_q4_is_refused_and_the_message_says_what_fits():
    with pytest.raises(VramBudgetError) as err:
        plan(QWEN7B, "q4", 4096)
    text = str(err.value)
    assert "\n" not in text and "3.20 GiB" in text and "3.66 GiB" in text
    assert "'mixed' recipe (2.93 GiB)" in text and "Qwen2.5-3B" in text


def test_too_long_context_names_the_largest_that_fits():
    with pytest.raises(VramBudgetError, match=r"fits with max context (\d+) at batch size 1") as err:
        plan(QWEN7B, "mixed", 32768)
    largest = int(str(err.value).rsplit("max context ", 1)[1].split()[0])
    assert 4096 <= largest < 32768
    plan(QWEN7B, "mixed", largest)  # the suggestion really fits, and is the largest that does
    with pytest.raises(VramBudgetError):
        plan(QWEN7B, "mixed", largest + 16)


def test_fewer_slots_are_suggested_when_they_fit():
    with pytest.raises(VramBudgetError, match=r"or batch size (\d+) at context 4096") as err:
        plan(QWEN3B, "w4", 4096, slots=32)
    slots = int(str(err.value).rsplit("batch size ", 1)[1].split()[0])
    plan(QWEN3B, "w4", 4096, slots=slots)
    with pytest.raises(VramBudgetError):
        plan(QWEN3B, "w4", 4096, slots=slots + 1)


def test_budget_parsing_and_defaults():
    assert parse_size("3.2GiB") == int(3.2 * GiB)
    assert parse_size("3200MiB") == 3200 * MiB == parse_size("3200m")
    assert parse_size("1024") == 1024
    for bad in ("lots", "-1GiB", "0", ""):
        with pytest.raises(Exception, match="--vram-budget"):
            parse_size(bad)
    card = GpuInfo("card", 4 * GiB, 3 * GiB, 16, (8, 6))
    assert default_budget(card) == 3 * GiB - 256 * MiB  # 5 % of 4 GiB is less than the 256 MiB floor
    assert resolve_budget(None, card) == default_budget(card)
    with pytest.raises(VramBudgetError, match="more than the 3.00 GiB free"):
        resolve_budget(parse_size("3.5GiB"), card)


def test_requested_budget_leaves_room_for_what_cuda_takes_beside_it():
    """The H200 with 3.29 GiB free (a 4 GB card's case, emulated): a 3.2 GiB budget for the 7B
    was accepted and loading died in CUDA's own out-of-memory error. Now the budget is lowered
    to what is free less what CUDA takes beside the allocator, and the planner says what fits."""
    card = GpuInfo("card", 4 * GiB, int(3.29 * GiB), 16, (8, 6))
    assert resolve_budget(parse_size("3.2GiB"), card) == card.free_bytes - BESIDE_ALLOCATOR
    assert resolve_budget(parse_size("3.0GiB"), card) == parse_size("3.0GiB")
    assert default_budget(card) <= card.free_bytes - BESIDE_ALLOCATOR
    nearly_full = GpuInfo("card", 4 * GiB, 200 * MiB, 16, (8, 6))
    for requested in (None, 100 * MiB):
        with pytest.raises(VramBudgetError, match="has only 0.20 GiB free"):
            resolve_budget(requested, nearly_full)


def fitted(spec, recipe, slots, context, budget):
    return fitted_shape(spec, model_weight_bytes(spec, recipe), num_slots=slots, max_context=context,
                        budget_bytes=budget, gpu=RTX_3050_LAPTOP)


def test_a_fitted_load_keeps_the_context_with_fewer_requests_then_shortens_it():
    """The tray's 7B on a card with 3.4 GiB free (default budget 3.15 GiB): 4 requests x 4,096
    tokens do not fit; one request with the longest context that does is what it loads."""
    budget = resolve_budget(None, RTX_3050_LAPTOP)
    with pytest.raises(VramBudgetError):
        plan(QWEN7B, "mixed", 4096, budget=str(budget), slots=4)
    slots, context = fitted(QWEN7B, "mixed", 4, 4096, budget)
    assert slots == 1 and 3000 < context < 4096 and context % 16 == 0
    plan(QWEN7B, "mixed", context, budget=str(budget))  # it fits, and 16 tokens more would not
    with pytest.raises(VramBudgetError):
        plan(QWEN7B, "mixed", context + 16, budget=str(budget))
    assert fitted(QWEN3B, "w4", 32, 4096, budget)[1] == 4096  # fewer slots first, the context kept
    assert fitted(QWEN3B, "w4", 32, 4096, budget)[0] < 32
    # not even one request of 1,024 tokens: nothing is fitted (the refusal stands)
    too_small = model_weight_bytes(QWEN7B, "mixed") + 40 * MiB
    assert fitted(QWEN7B, "mixed", 4, 4096, too_small) is None


def test_a_load_is_fitted_only_when_asked():
    """load_plan.plan_load for the tray's 7B on the RTX 3050 (3.4 GiB free): refused as asked,
    fitted with fit=True; and a requested budget above what the card can give is lowered."""
    args = dict(num_slots=4, max_context=4096, label="Qwen2.5-7B", prefill_mode="auto")
    nbytes = model_weight_bytes(QWEN7B, "mixed")
    with pytest.raises(VramBudgetError, match="fits with max context"):
        plan_load(QWEN7B, nbytes, RTX_3050_LAPTOP, vram_budget=None, **args)
    fitted_plan = plan_load(QWEN7B, nbytes, RTX_3050_LAPTOP, vram_budget=None, fit=True, **args)
    budget = resolve_budget(None, RTX_3050_LAPTOP)
    assert (fitted_plan.num_slots, fitted_plan.max_context) == fitted(QWEN7B, "mixed", 4, 4096, budget)
    assert fitted_plan.total_bytes <= fitted_plan.budget_bytes == budget
    tight = GpuInfo("card", 4 * GiB, int(3.29 * GiB), 16, (8, 6))
    with pytest.raises(VramBudgetError, match=r"--vram-budget 3\.20 GiB lowered to 3\.04 GiB"):
        plan_load(QWEN7B, nbytes, tight, vram_budget=parse_size("3.2GiB"), **args | dict(num_slots=1))


def test_plan_reports_bytes_for_health():
    info = plan(QWEN3B, "w4", 8192).as_dict()
    assert {"vram_budget_bytes", "planned_weights_bytes", "planned_kv_cache_bytes"} <= set(info)
    assert all(k.endswith("_bytes") and isinstance(v, int) for k, v in info.items())


# -- dequantization inside graphs: bit-equal to app.formats -----------------------------------

@pytest.mark.parametrize("bits,layout", [(4, "rows"), (4, "tiles"), (3, "rows"), (3, "tiles")])
def test_dequantize_rows_and_lookup_equal_app_quant(bits, layout):
    n = 304  # whole 16-row tiles, so W3 can be repacked
    g = torch.Generator().manual_seed(bits)
    dense = LinearWeight(16, n, 640, dense=(torch.randn(n, 640, generator=g) * 0.05).half())
    q = quantize_linear(dense, bits)
    want = dequantized_linear(q).half()  # fp16(q * scale), app.formats' rounding
    if layout == "tiles":
        q = to_kernel_layout_linear(q)
        assert q.layout == "tiles" and torch.equal(dequantized_linear(q).half(), want)
    tables = DequantTables("cpu")
    assert torch.equal(dequantize_rows(q, 0, n, tables), want)
    assert torch.equal(dequantize_rows(q, 17, 95, tables), want[17:95])
    ids = torch.tensor([5, 0, n - 1, 5], dtype=torch.int32)
    out = torch.full((4, 640), float("nan"), dtype=torch.float16)
    assert torch.equal(lookup_rows(q, ids, tables, out), want[ids.long()])


def to_kernel_layout_linear(w: LinearWeight) -> LinearWeight:
    """One packed weight in the GEMV's tile layout, as the runner converts it (a new copy; no layers)."""
    spec = hf_spec(vocab_size=16, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                   num_attention_heads=2, num_key_value_heads=1)
    norm = torch.ones(128, dtype=torch.float16, device=w.scales.device)
    return to_kernel_layout(ModelWeights(spec, w, [], norm, w), in_place=False).lm_head


def emulate_dequant_kernel(q: LinearWeight) -> torch.Tensor:
    """The bit arithmetic of app/kernels/dequant.py's kernels, word by word, in PyTorch int64."""
    words = (q.qa.long() & 0xFFFFFFFF).view(q.out_features, -1)  # unsigned 32-bit words
    s = q.scales.float().repeat_interleave(128, dim=1)  # [N, K]
    if q.bits == 4:  # output word (r, j) is tile word 4 * lane_vec + j % 4; pair m = nibbles m, 4 + m
        tiles = (q.qa.long() & 0xFFFFFFFF).view(-1)
        groups = q.in_features // 128
        r, j = torch.arange(q.out_features)[:, None], torch.arange(q.in_features // 8)[None, :]
        slot = r & 15
        lane_vec = (((r >> 4) * groups + (j >> 4)) * 2 + (slot >> 3)) * 32 + 4 * (slot & 7) + ((j >> 2) & 3)
        words = tiles[4 * lane_vec + (j & 3)]  # [N, K/8]: the checkpoint's words
        even = torch.stack([(words >> (4 * m)) & 15 for m in range(4)], -1)
        odd = torch.stack([(words >> (16 + 4 * m)) & 15 for m in range(4)], -1)
        u, offset = torch.stack((even, odd), -1).view(q.out_features, -1), 8
    else:  # tile layout: thread (row r, group, t) reads a[4at + 2h], a[4at + 2h + 1], b[2at + h]
        a, b = (q.qa.long() & 0xFFFFFFFF).view(-1), (q.qb.long() & 0xFFFFFFFF).view(-1)
        groups = q.in_features // 128
        r = torch.arange(q.out_features)[:, None, None]
        grp, t = torch.arange(groups)[None, :, None], torch.arange(4)[None, None, :]
        slot = r & 15
        at = ((r >> 4) * groups + grp) * 32 + 4 * (slot & 7) + t  # [N, groups, 4]
        h = slot >> 3
        w = [a[4 * at + 2 * h], a[4 * at + 2 * h + 1], b[2 * at + h]]
        pairs = [torch.stack(((w[p // 5] >> (3 * (p % 5))) & 7, (w[p // 5] >> (16 + 3 * (p % 5))) & 7), -1)
                 for p in range(15)]
        pairs.append(torch.stack((sum(((w[j] >> 15) & 1) << j for j in range(3)),
                                  sum(((w[j] >> 31) & 1) << j for j in range(3))), -1))
        u, offset = torch.stack(pairs, -2).view(q.out_features, -1), 4
    return ((u - offset).float() * s).half()  # fp32 product (exact), one rounding


@pytest.mark.parametrize("bits", [4, 3])
def test_dequant_kernel_bit_mapping_emulated(bits):
    g = torch.Generator().manual_seed(20 + bits)
    q = quantize_linear(LinearWeight(16, 48, 384, dense=(torch.randn(48, 384, generator=g) * 0.05).half()), bits)
    q = to_kernel_layout_linear(q)
    assert torch.equal(emulate_dequant_kernel(q), dequantized_linear(q).half())


# -- the runner against the reference model --------------------------------------------------

def tiny_spec(arch: str = "qwen2") -> ModelSpec:
    """Kernel-friendly tiny shapes: head dim 64, K multiple of 128, GQA."""
    if arch == "qwen2":
        return hf_spec(vocab_size=1000, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return hf_spec(architectures=["LlamaForCausalLM"], vocab_size=1000, hidden_size=256, intermediate_size=384,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=4096,
                   tie_word_embeddings=True, rope_theta=500000.0,
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=128))


def random_model(spec: ModelSpec, seed: int, max_positions: int = 256) -> DecoderModel:
    """fp32 DecoderModel with random weights of realistic magnitude."""
    g = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        model = DecoderModel(spec, max_positions)
    model = model.to_empty(device="cpu").float()
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if "norm" in name:
            p.data = 1 + 0.1 * noise
        elif name.endswith("bias"):
            p.data = 0.1 * noise
        elif "embed" in name:
            p.data = noise
        else:
            p.data = noise / p.shape[1] ** 0.5
    model.init_rope()
    return model.eval()


def runtime_weights(model: DecoderModel, recipe: str | None):
    """fp16 runtime weights (quantized by ``recipe``); the reference model gets the dequantized values."""
    weights = weights_from_model(model).map_tensors(lambda t: t.half())
    if recipe is None:
        return weights
    weights = quantize_weights(weights, BUILTIN_RECIPES[recipe])
    for layer, lw in zip(model.layers, weights.layers):
        for module, w in ((layer.self_attn.qkv_proj, lw.qkv), (layer.self_attn.o_proj, lw.o),
                          (layer.mlp.gate_up_proj, lw.gate_up), (layer.mlp.down_proj, lw.down)):
            module.weight.data.copy_(dequantized_linear(w))
    model.embed_tokens.data.copy_(dequantized_linear(weights.embed))
    if model.lm_head is not None:
        model.lm_head.weight.data.copy_(dequantized_linear(weights.lm_head))
    return weights


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert torch.isfinite(a).all()
    return float((a.double() - b.double()).norm() / b.double().norm())


def compare_with_reference(runner, ref: TorchRunner, prompt: list[int], steps: int, slot: int = 1,
                           split: int | None = None) -> float:
    """Prefill (in two calls when ``split``) + ``steps`` teacher-forced decode steps; worst rel error."""
    parts = [(prompt[:split], 0), (prompt[split:], split)] if split else [(prompt, 0)]
    for ids, start in parts:
        want, got = ref.prefill(slot, ids, start), runner.prefill(slot, ids, start)
    worst = rel(got, want)
    token, pos = int(want.argmax()), len(prompt)
    for _ in range(steps):
        want = ref.decode([slot], [token], [pos])[0]
        got = runner.decode([slot], [token], [pos])[0]
        worst = max(worst, rel(got, want))
        assert int(got.argmax()) == int(want.argmax())
        token, pos = int(want.argmax()), pos + 1
    return worst


CASES = [("qwen2", None), ("qwen2", "mixed"), ("llama", "w4")]


@pytest.mark.parametrize("arch,recipe", CASES)
@pytest.mark.parametrize("prefill_mode", ["gemm", "graph"])
def test_runner_on_cpu_matches_reference(arch, recipe, prefill_mode):
    spec = tiny_spec(arch)
    model = random_model(spec, seed=3)
    weights = runtime_weights(model, recipe)
    ref = TorchRunner(model, StaticKVCache(spec, 2, 256, torch.float32, "cpu"), torch.device("cpu"))
    runner = CudaRunner(weights, num_slots=2, max_context=256, prefill_mode=prefill_mode)
    if runner.gemm is not None:  # several tiles per weight and several chunks per call
        runner.gemm.tile = runner.gemm.tile[: 100 * 384]  # 96-row tiles
        runner.gemm.chunk = 16
    prompt = torch.randint(3, 1000, (37,), generator=torch.Generator().manual_seed(7)).tolist()
    assert compare_with_reference(runner, ref, prompt, steps=8, split=20) < LOGITS_BOUND


def test_greedy_ids_pad_rows_and_ranges_on_cpu():
    spec = tiny_spec()
    weights = runtime_weights(random_model(spec, seed=4), "w4")
    runner = CudaRunner(weights, num_slots=3, max_context=64, prefill_mode="graph")
    runner.prefill(0, [5, 6, 7], 0)
    runner.prefill(2, [9, 10], 0)
    untouched = runner.cache.k[:, 1].clone(), runner.cache.v[:, 1].clone()
    logits = runner.decode([0, 2], [8, 11], [3, 2])  # padded to 8 rows: pads must write nothing
    assert runner.decode_tokens([0, 2], [8, 11], [3, 2]) == logits.argmax(-1).tolist()
    assert torch.equal(runner.cache.k[:, 1], untouched[0]) and torch.equal(runner.cache.v[:, 1], untouched[1])
    with pytest.raises(ContextLengthError):
        runner.decode([0], [1], [64])
    with pytest.raises(ContextLengthError):
        runner.prefill(1, list(range(10)), 60)
    info = runner.memory_info()
    assert info["weights_bytes"] == runner.weights.nbytes and info["kv_cache_bytes"] == runner.cache.nbytes


def test_greedy_steps_chained_on_the_device_equal_steps_from_the_host():
    """decode_tokens_launch_next feeds each step's argmax to the next on the device, two steps in
    flight, and gives the ids one-step-at-a-time greedy decoding gives."""
    spec = tiny_spec()
    weights = runtime_weights(random_model(spec, seed=5), "w4")
    prompts = {0: [5, 6, 7], 2: [9, 10]}

    def fresh():
        runner = CudaRunner(weights, num_slots=3, max_context=16, prefill_mode="graph")
        for slot, ids in prompts.items():
            runner.prefill(slot, ids, 0)
        return runner

    slots, ids, positions = [0, 2], [8, 11], [3, 2]
    stepwise, want = fresh(), []
    for step in range(6):
        ids = stepwise.decode_tokens(slots, ids, [p + step for p in positions])
        want.append(ids)
    chained, got = fresh(), []
    with pytest.raises(RuntimeError, match="exactly one"):
        chained.decode_tokens_launch_next()
    chained.decode_tokens_launch(slots, [8, 11], positions)
    for step in range(6):
        if step < 5:
            chained.decode_tokens_launch_next()
            assert len(chained.decode_tokens_in_flight()) == 2
        ready = chained.decode_tokens_collect()
        got.append([ready[(s, p + step)] for s, p in zip(slots, positions)])
    assert got == want and chained.decode_tokens_collect() == {}
    assert torch.equal(chained.cache.k, stepwise.cache.k) and torch.equal(chained.cache.v, stepwise.cache.v)
    chained.decode_tokens_launch([0], [1], [15])  # the last position: no room for the next step
    with pytest.raises(ContextLengthError):
        chained.decode_tokens_launch_next()


# -- GPU: kernels, graphs, the engine (run on the device machine: pytest -m gpu) ---------------

def gpu_runner(weights, **kw) -> CudaRunner:
    return CudaRunner(weights.map_tensors(lambda t: t.to("cuda")), **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
def test_dequant_kernel_is_bit_equal_to_app_quant(bits):
    from app.kernels.dequant import DequantKernel

    n = 1000  # a padded last tile
    g = torch.Generator().manual_seed(10 + bits)
    dense = LinearWeight(16, n, 1152, dense=(torch.randn(n, 1152, generator=g) * 0.05).half())
    q = quantize_linear(dense, bits)
    want = dequantized_linear(q).half().cuda()
    qg = to_kernel_layout_linear(replace(q, qa=q.qa.cuda(), qb=None if q.qb is None else q.qb.cuda(),
                                         scales=q.scales.cuda()))  # repacked on the GPU, as the runner does
    kernel = DequantKernel(torch.device("cuda"))
    for start, stop in ((0, n), (13, 77), (n - 1, n)):
        out = torch.full((stop - start, 1152), float("nan"), dtype=torch.float16, device="cuda")
        assert torch.equal(kernel.rows(qg.bits, qg.qa, qg.qb, qg.scales, start, stop, out), want[start:stop])
        assert torch.equal(dequantize_rows(qg, start, stop, DequantTables("cuda")), want[start:stop])
        fresh = torch.full_like(out, float("nan"))
        assert torch.equal(dequantize_rows(qg, start, stop, DequantTables("cuda"), out=fresh, kernel=kernel),
                           want[start:stop])  # the prefill's call


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [4, 3])
def test_embedding_lookup_kernel_is_bit_equal_to_pytorch_and_graph_safe(bits):
    from app.kernels.dequant import DequantKernel

    n, k = 1024, 896
    g = torch.Generator().manual_seed(20 + bits)
    q = quantize_linear(LinearWeight(16, n, k, dense=(torch.randn(n, k, generator=g) * 0.05).half()), bits)
    want = dequantized_linear(q).half().cuda()
    qg = to_kernel_layout_linear(replace(q, qa=q.qa.cuda(), qb=None if q.qb is None else q.qb.cuda(),
                                         scales=q.scales.cuda()))
    kernel, tables = DequantKernel(torch.device("cuda")), DequantTables("cuda")
    ids = torch.tensor([n - 1, 0, 517, 517, 3], dtype=torch.int32, device="cuda")
    out = torch.full((5, k), float("nan"), dtype=torch.float16, device="cuda")
    assert torch.equal(lookup_rows(qg, ids, tables, out, kernel), want[ids.long()])
    assert torch.equal(lookup_rows(qg, ids, tables, out.clone()), want[ids.long()])  # PyTorch's
    graph = torch.cuda.CUDAGraph()  # the ids are read on the device: new ids, same graph
    with torch.cuda.graph(graph):
        kernel.lookup(qg.bits, qg.qa, qg.qb, qg.scales, ids, out)
    ids.copy_(torch.tensor([7, 8, n - 2, 0, 1], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, want[ids.long()])


@pytest.mark.gpu
@pytest.mark.parametrize("arch,recipe", CASES)
@pytest.mark.parametrize("prefill_mode", ["gemm", "graph"])
def test_gpu_runner_matches_fp32_reference_over_50_steps(arch, recipe, prefill_mode):
    spec = tiny_spec(arch)
    model = random_model(spec, seed=5)
    weights = runtime_weights(model, recipe)
    ref = TorchRunner(model, StaticKVCache(spec, 2, 256, torch.float32, "cpu"), torch.device("cpu"))
    from app.kernels.dequant import DequantKernel

    runner = gpu_runner(weights, num_slots=2, max_context=256, prefill_mode=prefill_mode,
                        dequant_kernel=DequantKernel(torch.device("cuda")))
    prompt = torch.randint(3, 1000, (70,), generator=torch.Generator().manual_seed(8)).tolist()
    worst = compare_with_reference(runner, ref, prompt, steps=50, split=33)
    print(f"{arch} {recipe} {prefill_mode}: worst rel logits error {worst:.2e}")
    assert worst < LOGITS_BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "mixed"])
def test_graph_replay_equals_eager(recipe):
    weights = runtime_weights(random_model(tiny_spec(), seed=6), recipe)
    graphed = gpu_runner(weights, num_slots=4, max_context=128, prefill_mode="gemm")
    eager = gpu_runner(weights, num_slots=4, max_context=128, prefill_mode="gemm", use_graphs=False)
    assert graphed.graphs.graphs and not eager.graphs.graphs
    graphed.padded_prefill = False  # the same eager prefill in both: this compares the decode graphs
    prompts = [[5 + i, 6, 7 + 2 * i, 8] for i in range(3)]
    for slot, prompt in enumerate(prompts):
        assert torch.equal(graphed.prefill(slot, prompt, 0), eager.prefill(slot, prompt, 0))
    tokens, pos = [1, 2, 3], [4, 4, 4]
    for _ in range(20):
        a, b = graphed.decode([0, 1, 2], tokens, pos), eager.decode([0, 1, 2], tokens, pos)
        if recipe is None:  # cuBLAS may pick another algorithm under capture: same tokens, ~1 ulp
            assert a.argmax(-1).tolist() == b.argmax(-1).tolist() and rel(a, b) < 1e-3
        else:  # our kernels: the graph replays exactly the eager launches
            assert torch.equal(a, b)
        tokens, pos = a.argmax(-1).tolist(), [p + 1 for p in pos]


@pytest.mark.gpu
def test_gpu_decode_rows_do_not_depend_on_the_batch():
    weights = runtime_weights(random_model(tiny_spec(), seed=7), "w4")
    runner = gpu_runner(weights, num_slots=4, max_context=128, prefill_mode="gemm")
    assert runner.graphs.buckets == [1, 2, 4, 8]
    for slot in range(4):
        runner.prefill(slot, [3 + slot, 4, 5], 0)
    together = runner.decode([0, 1, 2, 3], [7, 8, 9, 10], [3, 3, 3, 3])
    for slot in range(4):  # re-run one at a time (same position: same cache writes)
        assert torch.equal(runner.decode([slot], [7 + slot], [3])[0], together[slot])


@pytest.mark.gpu
def test_starter_model_greedy_text_matches_cpu_reference(starter_model_dir):
    """Dense fp16 on the GPU vs fp32 on the CPU: the first 16 greedy tokens must agree (printed: how many do)."""
    from app.engine import Engine, SamplingParams

    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    with Engine.load(starter_model_dir, device="cpu", max_batch_size=1) as cpu:
        want = cpu.chat(messages, params).result.token_ids
    gc.collect()
    torch.cuda.empty_cache()  # earlier tests' cached blocks would count against the budget cap
    before = torch.cuda.memory_reserved()
    with Engine.load(starter_model_dir, device="cuda", max_batch_size=4, vram_budget="2GiB") as gpu:
        assert type(gpu.runner).__name__ == "CudaRunner"
        got = gpu.chat(messages, params).result.token_ids
        info = gpu.stats()
    same = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), len(want))
    print(f"starter: first {same} of {len(want)} greedy tokens equal to the fp32 CPU reference")
    assert same >= 16
    assert info["cuda_reserved_bytes"] <= before + info["vram_budget_bytes"]
    assert info["weights_bytes"] > 250 * MiB  # 135 M parameters in fp16


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", [None, "w4"])
def test_engine_batched_greedy_equals_alone(tiny_qwen_dir, recipe):
    """Greedy output per request is identical alone and batched (engine, CUDA graphs)."""
    from app.engine import Engine, SamplingParams
    from app.engine.loading import LoadedModel
    from app.engine.tokenizer import Tokenizer

    spec = tiny_spec()
    weights = runtime_weights(random_model(spec, seed=9), recipe)
    loaded = LoadedModel(tiny_qwen_dir, "tiny", spec, Tokenizer.from_folder(tiny_qwen_dir), None, torch.float16)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = [[11 + i, 40, 300 + 7 * i, 5, 9 * i + 1][: 3 + i] for i in range(4)]
    with Engine(loaded, gpu_runner(weights, num_slots=4, max_context=128), 4) as engine:
        alone = [engine.generate(p, params).result.token_ids for p in prompts]
        handles = [engine.generate(p, params) for p in prompts]
        together = [h.result.token_ids for h in handles]
    assert alone == together


# -- a real quantized checkpoint (app.quant) through the runtime ---------------------------------

@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, qwen_tokenizer_dir):
    """A tiny Qwen2 with kernel-friendly shapes, quantized by app.quant with the 'mixed' recipe."""
    from tests.conftest import build_tiny_model

    from app.quant.quantizer import QuantizeJob, quantize_model

    src = build_tiny_model(tmp_path_factory.mktemp("tiny-q"), qwen_tokenizer_dir, "qwen2", hidden_size=128,
                           intermediate_size=256, num_attention_heads=2, num_key_value_heads=1, seed=3)
    out = tmp_path_factory.mktemp("tiny-q-ckpt")
    quantize_model(QuantizeJob(src, out, BUILTIN_RECIPES["mixed"], method="rtn"))
    return out


def test_quantized_checkpoint_loads_packed_and_runs(tiny_checkpoint):
    from app.engine.cuda.runner import load_packed
    from app.engine.loading import load_quantized_model
    from app.engine.quantized.modules import QuantLinear

    loaded = load_packed(tiny_checkpoint, max_context=64)
    quant = [m for m in loaded.model.modules() if isinstance(m, QuantLinear)]
    assert quant and all(m.dense_weight is None for m in quant)  # nothing dequantized at load
    weights = weights_from_model(loaded.model)
    assert [w.bits for w in (weights.layers[0].qkv, weights.layers[0].down, weights.lm_head)] == [4, 3, 4]  # mixed keeps the head at 4 bits
    reference = load_quantized_model(tiny_checkpoint, torch.device("cpu"), dtype=torch.float32, max_context=64)
    ref = TorchRunner(reference.model, StaticKVCache(reference.spec, 1, 64, torch.float32, "cpu"),
                      torch.device("cpu"))
    runner = CudaRunner(weights, num_slots=1, max_context=64)
    prompt = loaded.tokenizer.encode("Hello, quantized world")
    # (the reference ops dequantize the 151k-row head at every call: few steps keep this fast)
    assert compare_with_reference(runner, ref, prompt, steps=2, slot=0) < LOGITS_BOUND


@pytest.mark.gpu
def test_engine_loads_a_quantized_checkpoint_on_cuda(tiny_checkpoint):
    from app.engine import Engine, SamplingParams

    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    with Engine.load(tiny_checkpoint, device="cuda", max_batch_size=2, max_context=256,
                     vram_budget="512MiB") as engine:
        assert type(engine.runner).__name__ == "CudaRunner"
        assert engine.runner.weights.layers[0].gate_up.bits == 3
        result = engine.complete("Hello", SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)).result
        info = engine.stats()
    assert result.usage.completion_tokens == 8
    assert info["weights_bytes"] < 40 * MiB and info["vram_budget_bytes"] == 512 * MiB
    assert info["cuda_reserved_bytes"] <= before + info["vram_budget_bytes"]  # the allocator cap held


@pytest.mark.gpu
def test_prefill_graphs_captured_on_the_engines_thread_stay_inside_the_plan(tiny_checkpoint):
    """The load captures the largest prefill bucket; the engine's own thread captures each smaller
    one at its first prompt (with a cuBLAS workspace of its own): the peak stays in the plan."""
    from app.engine import Engine, SamplingParams

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_reserved()
    with Engine.load(tiny_checkpoint, device="cuda", max_batch_size=2, max_context=512,  # the model's maximum
                     vram_budget="512MiB") as engine:
        buckets = engine.runner.prefill_graphs.buckets
        assert engine.stats()["prefill_graph_buckets"] == [buckets[-1]] and len(buckets) > 3
        ids = engine.tokenizer.encode("one two three four five six seven eight nine ten " * 60)
        for n in [b // 2 + 1 for b in buckets]:  # each bucket's first prompt, on the engine's thread
            engine.generate(ids[:n], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)).result
        info, planned = engine.stats(), engine.runner.plan.total_bytes
    assert info["prefill_graph_buckets"] == buckets
    peak = torch.cuda.max_memory_reserved() - before
    print(f"peak {peak / MiB:.1f} MiB reserved, plan {planned / MiB:.1f} MiB")
    assert peak <= planned


@pytest.mark.gpu
def test_closing_an_engine_gives_its_memory_back(tiny_checkpoint):
    """A model switch closes the old engine, then plans the new one against the free memory:
    closing hands the weights, the cache and the graphs' pool back to the driver, and switching
    again leaves nothing more behind (what stays is cuBLAS's workspace for the capture stream)."""
    from app.engine import Engine

    def load_and_close() -> tuple[int, int]:
        engine = Engine.load(tiny_checkpoint, device="cuda", max_batch_size=2, max_context=256,
                             vram_budget="512MiB")
        loaded = torch.cuda.memory_reserved()
        engine.close()  # while `engine` still names the object
        return loaded, torch.cuda.memory_reserved()

    gc.collect()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved()
    loaded, after_first = load_and_close()
    assert loaded - before > 64 * MiB  # embedding and lm_head of Qwen's vocabulary, the cache, the graphs
    assert after_first - before < (loaded - before) / 4
    _, after_second = load_and_close()
    assert after_second <= after_first


# -- shapes the kernels do not cover ------------------------------------------------------------

def test_unsupported_head_dim_is_named_and_qwen_shapes_are_supported():
    from app.engine.cuda.ops import unsupported_shape

    assert unsupported_shape(QWEN3B) is None and unsupported_shape(QWEN7B) is None
    assert unsupported_shape(tiny_spec("llama")) is None
    odd = replace(tiny_spec(), head_dim=16)
    assert unsupported_shape(odd) == "head_dim 16 has no decode-attention kernel (only 64 and 128)"


@pytest.mark.gpu
def test_a_model_the_kernels_do_not_cover_runs_on_the_reference_path(tiny_qwen_dir, caplog):
    """tiny_qwen_dir has head_dim 16: Engine.load on CUDA warns and serves it with the PyTorch
    runner on the GPU instead of failing while capturing the decode graphs."""
    from app.engine import Engine, SamplingParams
    from app.engine.runner import TorchRunner

    with caplog.at_level("WARNING"), Engine.load(tiny_qwen_dir, device="cuda", max_batch_size=2) as engine:
        out = engine.generate([5, 6, 7], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)).result
        assert isinstance(engine.runner, TorchRunner) and engine.device == "cuda"
        assert engine.kernels_unavailable == "head_dim 16 has no decode-attention kernel (only 64 and 128)"
    assert len(out.token_ids) == 4
    assert "head_dim 16 has no decode-attention kernel" in caplog.text
