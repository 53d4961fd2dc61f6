"""Sampled tokens drawn where the logits are (app.engine.sampling): the counter-based uniform
numbers, the batched draw against the host sampler, the distribution after top-k / top-p, and
the CudaRunner's decode_tokens steps drawing what the host would draw from the same logits —
chained on the device like greedy steps. Runner and engine tests run on the CPU
(ReferenceOps) and, marked ``gpu``, on CUDA with graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine import SamplingParams
from app.engine.runner import RunnerOptions
from app.engine.sampling import RequestSampler, RowSampling, probabilities, sample_rows, uniform

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
PARAMS = [  # (temperature, top_p, top_k): temperature only, top-p, top-k, both, argmax
    (0.9, 1.0, 0), (1.3, 0.85, 0), (0.6, 1.0, 7), (1.1, 0.9, 40), (0.0, 1.0, 0),
]


def test_uniform_depends_only_on_seed_and_position():
    us = [uniform(12345, p) for p in range(20_000)]
    assert us == [uniform(12345, p) for p in range(20_000)]  # no state
    assert all(0.0 <= u < 1.0 and float(np.float32(u)) == u for u in us)  # exact in float32
    assert uniform(12345, 7) != uniform(12346, 7) != uniform(12346, 8)
    assert uniform(-3 % 2**64, 5) == uniform(2**64 - 3, 5)
    counts = np.bincount((np.array(us) * 16).astype(int), minlength=16)
    chi2 = float(((counts - 1250.0) ** 2 / 1250.0).sum())
    assert chi2 < 45.0, counts  # 15 degrees of freedom: p < 1e-4 for a fair generator


def reference_probabilities(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Written out the plain way, token by token: softmax at the temperature, the k most likely,
    then the most likely until their mass reaches top_p, renormalized."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = sorted(range(len(p)), key=lambda i: (-float(logits[i]), i))
    keep = order[:top_k] if top_k else order
    kept = p[keep] / p[keep].sum()
    mass, chosen = 0.0, []
    for i, q in zip(keep, kept.tolist()):
        if mass >= top_p:
            break
        chosen.append(i)
        mass += q
    out = torch.zeros_like(p)
    out[chosen] = p[chosen] / p[chosen].sum()
    return out


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.7, 0.8, 5), (1.0, 1.0, 3), (1.5, 0.6, 0)])
def test_draws_follow_the_filtered_distribution(temperature, top_p, top_k):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 1.0, 0.2])  # a tie at 1.0
    want = reference_probabilities(logits, temperature, top_p, top_k)
    sampler = RequestSampler(SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=4), [], 8)
    draws = 40_000
    counts = torch.bincount(torch.tensor([sampler.sample(logits, p) for p in range(draws)]), minlength=8).double()
    freq = counts / draws
    assert torch.all(freq[want == 0] == 0)  # filtered tokens are never drawn
    assert torch.all((freq - want).abs() <= 4.5 * (want * (1 - want) / draws).sqrt() + 1e-9), (freq, want)


def test_batched_draw_equals_the_host_sampler_row_by_row():
    """sample_rows over rows of different settings gives each row what RequestSampler.sample
    gives for the same logits and position (fresh random fp16 logits, ties included)."""
    vocab, positions = 3000, 40
    g = torch.Generator().manual_seed(9)
    samplers = [RequestSampler(SamplingParams(temperature=t, top_p=p, top_k=k, seed=100 + i), [], vocab)
                for i, (t, p, k) in enumerate(PARAMS)]
    rows = [s.row for s in samplers]
    for pos in range(positions):
        logits = (torch.randn(len(rows), vocab + 64, generator=g) * 3).half()  # + padded ids past the vocab
        want = [s.sample(logits[i], pos) for i, s in enumerate(samplers)]
        tokens = logits[:, :vocab].float().argmax(-1)  # what the graph leaves; argmax rows keep it
        temperature, top_p, top_k = (torch.tensor([getattr(r, name) for r in rows])
                                     for name in ("temperature", "top_p", "top_k"))
        u = torch.tensor([uniform(r.seed, pos) for r in rows])
        sample_rows(logits[:, :vocab], temperature.float(), top_p.float(), top_k, u, tokens,
                    filtered=any(r.filtered for r in rows))
        assert tokens.tolist() == want, pos


def test_probabilities_without_filters_are_the_softmax():
    scaled = torch.randn(3, 500, generator=torch.Generator().manual_seed(1))
    got = probabilities(scaled, torch.ones(3), torch.zeros(3, dtype=torch.long), filtered=False)
    assert torch.allclose(got, torch.softmax(scaled, -1))
    assert torch.allclose(probabilities(scaled, torch.ones(3), torch.zeros(3, dtype=torch.long), filtered=True), got,
                          atol=1e-7)  # top_p 1, top_k 0: the filters keep everything


def test_penalties_keep_the_draw_on_the_host():
    assert RequestSampler(SamplingParams(temperature=0.5, presence_penalty=0.5), [], 10).row is None
    assert RequestSampler(SamplingParams(temperature=0, repetition_penalty=1.1), [], 10).row is None
    row = RequestSampler(SamplingParams(temperature=0.5, top_p=0.9, seed=-1), [1, 2], 10).row
    assert row == RowSampling(0.5, 0.9, 0, 2**64 - 1, 10) and row.filtered


def within_rounding_of_the_draw(sampler: RequestSampler, logits: torch.Tensor, position: int, token: int) -> bool:
    """Whether ``token`` holds the draw's point u x total in the float64 cumulative
    distribution of ``logits``, give or take TOLERANCE of the total: the GPU's fp32 cumulative
    sum of 152k tokens rounds differently from the CPU's, which moves a boundary by ~1e-6 of
    the total, about one token's width when the distribution is flat (a random model)."""
    probs = sampler._probabilities(sampler._penalized(logits)).double()
    cdf = probs.cumsum(0)
    x = uniform(sampler.seed, position) * float(cdf[-1])
    low, high = (float(cdf[token - 1]) if token else 0.0), float(cdf[token])
    slack = CDF_TOLERANCE * float(cdf[-1])
    return bool(probs[token] > 0) and low - slack <= x <= high + slack


CDF_TOLERANCE = 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_decode_tokens_draw_what_the_host_draws_from_the_same_logits(engine_parts, model_dir, device):
    """Two sequences with different settings step by step: the runner's own draw (set_sampling,
    decode_tokens) equals RequestSampler.sample on the logits of the same step — on the CPU
    exactly; on the GPU, where the cumulative sums round differently, the drawn token must
    hold the draw's point within CDF_TOLERANCE, and most draws must be equal."""
    loaded, _, runner = engine_parts(model_dir, slots=2, max_context=96, device=device)
    vocab = loaded.tokenizer.vocab_size
    prompts = [loaded.tokenizer.encode("Once upon a time"), loaded.tokenizer.encode("def main():")]
    for settings in (PARAMS[0], PARAMS[3], PARAMS[1]):
        samplers = [RequestSampler(SamplingParams(temperature=t, top_p=p, top_k=k, seed=7 + i), [], vocab)
                    for i, (t, p, k) in enumerate((settings, PARAMS[4]))]  # slot 1: argmax
        for slot, sampler in enumerate(samplers):
            runner.set_sampling(slot, sampler.row)
        ids = [int(runner.prefill(slot, prompt, 0).argmax()) for slot, prompt in enumerate(prompts)]
        positions = [len(p) for p in prompts]
        drawn_differently = equal = 0
        for _ in range(24):
            logits = runner.decode([0, 1], ids, positions)  # the host path (same step, same cache writes)
            want = [s.sample(logits[i], positions[i] + 1) for i, s in enumerate(samplers)]
            got = runner.decode_tokens([0, 1], ids, positions)
            assert got[1] == want[1]  # the argmax slot
            if device == "cpu":
                assert got == want
            else:
                assert within_rounding_of_the_draw(samplers[0], logits[0], positions[0] + 1, got[0]), (got, want)
            equal += got == want
            drawn_differently += want[0] != int(logits[0, :vocab].argmax())
            ids, positions = got, [p + 1 for p in positions]
        assert drawn_differently > 0  # the sampled slot really sampled
        assert equal >= 20, equal


def run_engine(loaded, engine_type, runner, params: list[SamplingParams], prompts) -> tuple[list[list[int]], int]:
    """Token ids of requests run together (no guessing), and how many steps were chained."""
    chained = []
    launch_next = runner.decode_tokens_launch_next
    runner.decode_tokens_launch_next = lambda: chained.append(1) or launch_next()
    try:
        with engine_type(loaded, runner, len(prompts), lookup_draft=0) as engine:
            handles = [engine.generate(p, sp) for p, sp in zip(prompts, params)]
            return [list(h.result.token_ids) for h in handles], len(chained)
    finally:
        runner.decode_tokens_launch_next = launch_next


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_requests_chain_on_the_device_and_draw_what_the_host_would(engine_parts, model_dir, device):
    """Seeded sampled requests (one with top-p / top-k) decode through chained device steps,
    and their tokens equal the same requests drawn on the host from each step's logits."""
    loaded, engine_type, runner = engine_parts(model_dir, slots=2, max_context=96, device=device)
    prompts = [loaded.tokenizer.encode("Write a poem"), loaded.tokenizer.encode("List three colors")]
    # (temperature 0.5: almost no mass in the tail of ~1e-7 tokens, where the GPU's cumulative sum
    # may round a draw into the next token: the runner test above bounds that case)
    params = [SamplingParams(max_tokens=20, temperature=0.5, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=14, temperature=1.2, top_p=0.9, top_k=50, seed=5, ignore_eos=True)]
    on_device, chained = run_engine(loaded, engine_type, runner, params, prompts)
    assert chained > 0
    assert on_device == run_engine(loaded, engine_type, runner, params, prompts)[0]  # the same seeds, the same text
    from app.engine.cuda.runner import CudaRunner

    host_draw = CudaRunner(runner.weights, num_slots=2, max_context=96, options=RunnerOptions(draw_on_device=False))
    assert runner.capabilities.draw_on_device and not host_draw.capabilities.draw_on_device
    on_host, chained = run_engine(loaded, engine_type, host_draw, params, prompts)  # every draw on the host
    assert chained == 0 and on_host == on_device


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_temperatures_and_top_p_zero_reach_the_device_as_the_argmax(engine_parts, model_dir, device):
    """Settings that are greedy by SamplingParams' one rule reach the runner as temperature 0:
    the device draw never divides by a float32 subnormal (1e-38 overflowed to inf: NaN
    probabilities) nor searches the empty nucleus of top_p 0. Chained device steps give the
    greedy request's tokens."""
    loaded, engine_type, runner = engine_parts(model_dir, slots=2, max_context=96, device=device)
    prompts = [loaded.tokenizer.encode("Write a poem"), loaded.tokenizer.encode("List three colors")]
    greedy = [SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)] * 2
    want, _ = run_engine(loaded, engine_type, runner, greedy, prompts)
    for params in (dict(temperature=1e-38), dict(temperature=1.5, top_p=0.0), dict(temperature=1.0, top_p=1e-300)):
        sampled = [SamplingParams(max_tokens=12, seed=3 + i, ignore_eos=True, **params) for i in range(2)]
        assert all(RequestSampler(p, [], 10).row.temperature == 0 for p in sampled)
        got, chained = run_engine(loaded, engine_type, runner, sampled, prompts)
        assert got == want, params
        assert chained > 0  # drawn by the runner's decode steps, not on the host


@pytest.mark.parametrize("device", DEVICES)
def test_tokens_rows_draw_each_row_as_the_host_draws_it(engine_parts, model_dir, device):
    """The rows that check guessed tokens (consecutive tokens of one sequence in one step):
    tokens_rows draws each row as RequestSampler.sample does on the logits of the same step
    (logits_rows), at the row's own position. Exact on the CPU; on the GPU within fp32
    rounding of the draw's boundary."""
    loaded, _, runner = engine_parts(model_dir, slots=1, max_context=96, device=device)
    vocab = loaded.tokenizer.vocab_size
    prompt = loaded.tokenizer.encode("The quick brown fox")
    start = len(prompt) - 1
    runner.prefill(0, prompt[:-1], 0)
    equal = 0
    for settings in (PARAMS[0], PARAMS[3]):
        sampler = RequestSampler(SamplingParams(temperature=settings[0], top_p=settings[1], top_k=settings[2],
                                                seed=21), [], vocab)
        for trial in range(4):
            guesses = torch.randint(0, vocab, (4,), generator=torch.Generator().manual_seed(trial)).tolist()
            ids = [prompt[-1], *guesses]
            logits = runner.logits_rows(0, ids, start)
            want = [sampler.sample(logits[i], start + i + 1) for i in range(len(ids))]
            got = runner.tokens_rows(0, ids, start, sampler.row)
            if device == "cpu":
                assert got == want
            for i, token in enumerate(got):
                assert token == want[i] or within_rounding_of_the_draw(sampler, logits[i], start + i + 1, token)
            equal += got == want
    assert equal >= 6
    argmax = runner.tokens_rows(0, ids, start)  # no row: the argmax
    assert argmax == [int(runner.logits_rows(0, ids, start)[i].argmax()) for i in range(len(ids))]


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_guessing_on_the_device_gives_the_host_text(engine_on, device):
    """Seeded sampled requests on tiny models whose output repeats itself (test_lookup's), with
    guesses kept and missed: the text is the same with guessing off, and with every token
    drawn on the host."""
    from test_lookup import PROMPT, SEEDS

    cases = [SamplingParams(max_tokens=80, temperature=0.1, seed=5, ignore_eos=True),
             SamplingParams(max_tokens=80, temperature=0.1, top_p=0.9, seed=6, ignore_eos=True)]

    def run(model_seed: int, draft: int = 7, options: RunnerOptions | None = None) -> tuple[list[list[int]], dict]:
        with engine_on(device, draft, model_seed, options=options) as engine:
            return [list(engine.generate(PROMPT, p).result.token_ids) for p in cases], engine.stats()

    kept = 0
    for model_seed in SEEDS:
        on_device, stats = run(model_seed)
        kept += stats["lookup_kept"]
        assert run(model_seed, draft=0)[0] == on_device  # guessing off
        assert run(model_seed, options=RunnerOptions(draw_on_device=False))[0] == on_device
    assert kept > 0  # guesses were kept (and, the rows after them drawn, missed)


def test_the_vram_plan_counts_the_draw_workspace():
    """Every plan draws on the device, top-k / top-p included (the kernels sort nothing): the
    decode bytes hold the draw's workspace for every row, the same with a roomy budget and a
    tight one, and the 4 GB laptop's 7B plan still fits 3.2 GiB."""
    from test_cuda_runtime import QWEN7B, plan

    from app.engine.cuda.memory import GiB, GpuInfo, decode_buffer_bytes, parse_size
    from app.kernels.token_draw import draw_workspace_bytes

    laptop = plan(QWEN7B, "mixed", 4096)  # RTX 3050 Laptop, 3.2 GiB
    assert laptop.decode_rows == 16 and laptop.total_bytes <= parse_size("3.2GiB")
    h200 = GpuInfo("H200", 140 * GiB, 139 * GiB, 132, (9, 0))
    roomy = plan(QWEN7B, "mixed", 4096, gpu=h200)
    tight = plan(QWEN7B, "mixed", 4096, budget="3.19GiB", gpu=h200)
    assert tight.decode_bytes == roomy.decode_bytes and "host" not in tight.describe()
    buffers = decode_buffer_bytes(QWEN7B, roomy.decode_rows, roomy.attention_splits)
    assert draw_workspace_bytes(roomy.decode_rows) < buffers < roomy.decode_bytes
