"""Guessed tokens (app.engine.lookup): the n-gram index, the guess length, and greedy output
that is exactly the same with and without guessing — on the CPU (the CudaRunner with the
reference ops) and, marked ``gpu``, with the kernels and CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from app.engine.lookup import DraftLength, NgramLookup

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


# -- the index ---------------------------------------------------------------------------------

def test_draft_continues_the_latest_earlier_occurrence_of_the_longest_suffix():
    ids = [1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 1, 2, 3]
    # suffix (1, 2, 3) occurred at 0..2 -> what followed: 9, 9, 2, 3
    assert NgramLookup(ids).draft(4) == [9, 9, 2, 3]
    ids = [5, 2, 3, 4, 1, 2, 3, 6, 7, 2, 3]
    # (2, 3) occurred twice before: the latest (5..6) wins -> 6, 7, 2, 3
    assert NgramLookup(ids).draft(4) == [6, 7, 2, 3]


def test_draft_is_empty_without_a_match_and_never_matches_a_single_token():
    assert NgramLookup([1, 2, 3, 4, 5]).draft(4) == []
    assert NgramLookup([7, 1, 2, 7]).draft(4) == []  # only the 1-gram (7) repeats
    assert NgramLookup([4]).draft(3) == [] and NgramLookup([]).draft(3) == []
    assert NgramLookup([1, 2, 1, 2]).draft(0) == []


def test_draft_stops_at_the_end_of_the_sequence_and_at_k():
    ids = [1, 2, 1, 2]  # (1, 2) at 0..1 -> 1, 2 (the suffix itself), nothing after that
    assert NgramLookup(ids).draft(8) == [1, 2]
    assert NgramLookup([3, 4, 5, 6, 7, 3, 4]).draft(2) == [5, 6]


def test_index_grows_with_the_live_list():
    ids = [10, 11, 12, 13]
    lookup = NgramLookup(ids)
    assert lookup.draft(3) == []
    ids += [10, 11]  # the sequence appends; the index catches up on the next call
    assert lookup.draft(3) == [12, 13, 10]
    ids += [99]
    assert lookup.draft(3) == []
    ids += [10, 11]
    assert lookup.draft(3) == [99, 10, 11]  # the latest (10, 11) is at 4..5 now


def test_index_matches_a_brute_force_search():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (300,), generator=g).tolist()
    lookup = NgramLookup([])
    for i, token in enumerate(ids):
        lookup.ids.append(token)
        seq = ids[: i + 1]
        want = []
        for n in range(min(4, len(seq) - 1), 1, -1):
            suffix = seq[-n:]
            ends = [e for e in range(n, len(seq)) if seq[e - n:e] == suffix]
            if ends:
                want = seq[ends[-1]:ends[-1] + 5]
                break
        assert lookup.draft(5) == want, i


def test_checking_a_guess_samples_exactly_the_model_distribution():
    """Speculative sampling with a guess certain of itself: over many draws the tokens follow
    the sampler's own distribution (temperature, top-k), whichever token was guessed."""
    from app.engine import SamplingParams
    from app.engine.sampling import RequestSampler

    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    params = SamplingParams(temperature=0.8, top_k=5, seed=11)
    sampler = RequestSampler(params, [], 6)
    want = torch.softmax(torch.where(torch.arange(6) < 5, logits / 0.8, torch.tensor(float("-inf"))), -1)
    draws = 40_000
    for guess in (0, 2, 5):
        counts = torch.zeros(6)
        kept = 0
        for position in range(draws):  # (the draw's counter)
            token, is_guess = sampler.check(logits, guess, position)
            counts[token] += 1
            kept += is_guess
            assert is_guess == (token == guess)
        freq = counts / draws
        # 4.5 standard errors of a binomial frequency: a wrong rule (e.g. always keeping the
        # guess, or redrawing from p with the guess still in it) is off by far more
        assert torch.all((freq - want).abs() <= 4.5 * (want * (1 - want) / draws).sqrt() + 1e-9), (guess, freq, want)
        assert abs(kept / draws - float(want[guess])) <= 4.5 * (float(want[guess]) / draws) ** 0.5 + 1e-9


def test_guess_length_grows_on_full_hits_and_shrinks_on_misses():
    length = DraftLength(maximum=7)
    assert length.current == 4
    length.update(4, 4)
    assert length.current == 7  # doubled, capped
    length.update(7, 2)
    assert length.current == 3  # one past what was kept
    length.update(3, 0)
    assert length.current == 1
    length.update(1, 0)
    assert length.current == 1  # never below one
    length.update(0, 0)
    assert length.current == 1  # nothing guessed: unchanged
    with pytest.raises(ValueError):
        DraftLength(maximum=0)


# -- the engine: same output, fewer steps --------------------------------------------------------

SEEDS = (1, 5)  # tiny random models whose greedy output repeats spans of itself (vocabulary 1,000)
PROMPT = [5, 17, 99, 3, 250, 8, 41, 5, 17, 99]
# engine_on(device, lookup_draft, seed, max_context, options) (tests/conftest.py): an Engine over
# the tiny random W4 Qwen2 of that seed.


GREEDY = {"plain": {}, "penalties": dict(repetition_penalty=1.05)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("penalties", GREEDY.values(), ids=GREEDY.keys())
def test_greedy_output_is_the_same_with_guessed_tokens(engine_on, device, penalties):
    """Plain greedy checks the guesses by the argmax on the device; with penalties the logits
    come back and each row is penalized by the tokens kept before it."""
    from app.engine import SamplingParams

    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True, **penalties)
    guessed = kept = 0
    for seed in SEEDS:
        results, stats = {}, {}
        for draft in (0, 7):
            with engine_on(device, draft, seed) as engine:
                results[draft] = engine.generate(PROMPT, params).result
                stats[draft] = engine.stats()
        assert results[7].token_ids == results[0].token_ids
        assert results[7].text == results[0].text
        assert stats[0]["lookup_guessed"] == 0
        guessed += stats[7]["lookup_guessed"]
        kept += stats[7]["lookup_kept"]
    assert guessed > 0 and kept > 0  # the path ran, and some guesses were the model's own tokens


@pytest.mark.parametrize("device", DEVICES)
def test_guessing_stops_at_max_tokens_stop_strings_and_the_context(engine_on, device):
    from app.engine import SamplingParams

    seed = SEEDS[1]
    with engine_on(device, 0, seed, max_context=64) as engine:
        plain = engine.generate(PROMPT, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)).result
    stop = plain.text[len(plain.text) // 2:][:3]
    cases = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (1, 2, 9, 13, 31)]
    cases.append(SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=[stop]))
    cases.append(SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))  # runs into the context
    outputs, guessed = {}, {}
    for draft in (0, 7):
        with engine_on(device, draft, seed, max_context=64) as engine:
            outputs[draft] = [engine.generate(PROMPT, p).result for p in cases]
            guessed[draft] = engine.stats()["lookup_guessed"]
    assert guessed[0] == 0 and guessed[7] > 0
    for params, off, on in zip(cases, outputs[0], outputs[7]):
        assert (on.token_ids, on.text, on.finish_reason) == (off.token_ids, off.text, off.finish_reason), params
        assert len(on.token_ids) <= params.max_tokens
    assert outputs[7][-2].finish_reason == "stop" and outputs[7][-1].finish_reason == "length"
    assert len(PROMPT) + len(outputs[7][-1].token_ids) == 64


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_requests_guess_too_and_give_the_text_of_guessing_off(engine_on, device):
    """Sampling: each checked row draws the token of its position, so a seeded request gives
    the same text with guessing on and off, and again. (A low temperature: the tiny random
    models' distributions are flat; test_device_sampling has cases where guesses are kept.)"""
    from app.engine import SamplingParams

    guessed = 0
    for model_seed in SEEDS:
        texts = {}
        for draft in (7, 0):
            with engine_on(device, draft, model_seed) as engine:
                for seed in (5, 6):
                    params = SamplingParams(max_tokens=80, temperature=0.1, seed=seed, ignore_eos=True)
                    first = engine.generate(PROMPT, params).result
                    second = engine.generate(PROMPT, params).result
                    assert first.token_ids == second.token_ids and len(first.token_ids) == 80
                    texts[draft, seed] = first.token_ids
                guessed += engine.stats()["lookup_guessed"]
        assert texts[7, 5] == texts[0, 5] and texts[7, 6] == texts[0, 6]
    assert guessed > 0


@pytest.mark.parametrize("device", DEVICES)
def test_tokens_rows_equal_one_token_at_a_time(device):
    """The runner's check of guessed tokens: row j's argmax is what decoding token j alone gives."""
    from test_cuda_runtime import random_model, runtime_weights, tiny_spec

    from app.engine.cuda.runner import CudaRunner

    weights = runtime_weights(random_model(tiny_spec(), seed=21), "w4").map_tensors(lambda t: t.to(device))
    runner = CudaRunner(weights, num_slots=2, max_context=128)
    prompt = [5, 17, 99, 3, 250, 8, 41]
    runner.prefill(1, prompt, 0)
    guess = [12, 600, 7, 7, 31, 2, 900]
    got = runner.tokens_rows(1, [42, *guess], len(prompt))
    want = []
    for j, token in enumerate([42, *guess]):
        want += runner.decode_tokens([1], [token], [len(prompt) + j])
    assert got == want
    with pytest.raises(ValueError):
        runner.tokens_rows(1, list(range(runner.max_verify_rows + 1)), len(prompt))


def test_a_runner_that_cannot_check_guesses_never_guesses(tiny_qwen_dir):
    """The reference runner (TorchRunner) checks one token per step: no guessing there."""
    from app.engine import Engine, SamplingParams

    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1, max_context=128) as engine:
        engine.generate(PROMPT * 3, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)).result
        assert engine.stats()["lookup_guessed"] == 0


def test_the_gpu_runner_refuses_more_slots_than_a_step_has_rows():
    """More than 16 sequences at once would give the GEMVs (and the one-slot RoPE window) more
    rows than they take: refused up front, in one line that says what to change."""
    from test_cuda_runtime import random_model, runtime_weights, tiny_spec

    from app.engine.cuda.runner import MAX_SLOTS, ONE_SLOT_ROWS, CudaRunner
    from app.errors import QwenTrayError

    weights = runtime_weights(random_model(tiny_spec(), seed=2), "w4")
    with pytest.raises(QwenTrayError, match="max_batch_size") as refused:
        CudaRunner(weights, num_slots=MAX_SLOTS + 1, max_context=64)
    assert "\n" not in str(refused.value) and str(MAX_SLOTS) in str(refused.value)
    assert CudaRunner(weights, num_slots=MAX_SLOTS, max_context=64).max_verify_rows == ONE_SLOT_ROWS
