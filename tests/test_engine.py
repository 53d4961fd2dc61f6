"""Engine behaviour on a tiny random Qwen2 model: sampling, stops, batching, cancel, limits."""

from __future__ import annotations

import threading

import pytest
import torch

from app.engine import PRIORITY_BACKGROUND, PRIORITY_INTERACTIVE, Engine, SamplingParams
from app.engine.stops import StopStringMatcher
from app.errors import ContextLengthError, InvalidParameterError

CHAT = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def engine(tiny_qwen_dir):
    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=4, max_context=256) as e:
        yield e


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, **kw)


def test_result_reports_usage_and_length(engine):
    gen = engine.chat(CHAT, greedy(12))
    text = "".join(gen)
    res = gen.result
    assert res.finish_reason == "length"
    assert res.usage.prompt_tokens == len(engine.tokenizer.encode_chat(CHAT))
    assert res.usage.completion_tokens == 12 == len(res.token_ids)
    assert text == res.text == engine.tokenizer.decode(list(res.token_ids))


def test_same_seed_same_text_and_different_seed_differs(engine):
    def run(seed):
        return engine.chat(CHAT, SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)).wait(30).token_ids

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_a_top_k_past_the_vocabulary_keeps_every_token(engine):
    """Any k at least the vocabulary filters nothing, however large (the server's fuzz sent 2**63)."""
    def run(top_k):
        params = SamplingParams(max_tokens=8, temperature=1.0, top_k=top_k, seed=5, ignore_eos=True)
        return engine.chat(CHAT, params).wait(30).token_ids

    assert run(2**63) == run(2**70) == run(engine.spec.vocab_size) == run(0)


def test_top_k_one_and_tiny_top_p_are_greedy(engine):
    ref = engine.chat(CHAT, greedy(10)).wait(30).token_ids
    for params in (dict(top_k=1), dict(top_p=1e-6), dict(top_p=0.0), dict(top_p=1e-300)):
        got = engine.chat(CHAT, SamplingParams(max_tokens=10, temperature=1.5, seed=3, ignore_eos=True, **params)).wait(30)
        assert got.token_ids == ref, params


@pytest.mark.parametrize("temperature", [1e-6, 1e-38, 1e-45, 5e-324])
def test_a_temperature_too_small_to_divide_by_is_greedy(engine, temperature):
    """logits / 1e-38 overflowed float32 to inf: NaN probabilities and a garbage token, every step."""
    ref = engine.chat(CHAT, greedy(10)).wait(30).token_ids
    params = SamplingParams(max_tokens=10, temperature=temperature, seed=3, ignore_eos=True)
    assert engine.chat(CHAT, params).wait(30).token_ids == ref
    assert params.greedy  # and so the argmax on every runner (RequestSampler's row has temperature 0)


def test_the_smallest_repetition_penalty_keeps_the_logits_finite(engine):
    """A seen token's logit is divided by the penalty: 1e-38 made it inf (an empty answer); the
    smallest accepted penalty leaves every probability a number."""
    from app.engine.params import MIN_REPETITION_PENALTY
    from app.engine.sampling import RequestSampler

    params = SamplingParams(max_tokens=10, temperature=1.0, repetition_penalty=MIN_REPETITION_PENALTY, seed=3)
    sampler = RequestSampler(params, [1, 2, 3], 50)
    logits = torch.linspace(-40.0, 60.0, 50).half()  # fp16's range of logits, seen tokens at both ends
    probs = sampler._probabilities(sampler._penalized(logits))
    assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1.0) < 1e-5
    with pytest.raises(InvalidParameterError, match="between 0.01 and 10"):
        SamplingParams(repetition_penalty=1e-38)


def test_repetition_penalty_discourages_repeats(engine):
    plain = engine.chat(CHAT, greedy(40)).wait(30).token_ids
    penalised = engine.chat(CHAT, greedy(40, repetition_penalty=5.0)).wait(30).token_ids
    assert len(set(penalised)) > len(set(plain)) or len(set(penalised)) == 40


def test_stop_string_spanning_tokens_is_not_returned(engine):
    res = engine.chat(CHAT, greedy(30)).wait(30)
    ids = list(res.token_ids)
    pieces = [engine.tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    # Pick a stop string made of the end of token 5's text and the start of token 6's.
    a, b = pieces[5], pieces[6]
    stop = a[-2:] + b[len(a):len(a) + 2]
    assert len(stop) >= 3 and stop in res.text
    gen = engine.chat(CHAT, greedy(30, stop=(stop,)))
    streamed = "".join(gen)
    assert gen.result.finish_reason == "stop"
    assert streamed == gen.result.text == res.text[: res.text.index(stop)]


def test_stop_matcher_holds_partial_matches():
    m = StopStringMatcher(("</end>", "STOP"))
    assert m.feed("hello </") == ("hello ", False)
    assert m.feed("en") == ("", False)
    assert m.feed("x more ST") == ("</enx more ", False)
    assert m.feed("OP tail") == ("", True)
    m2 = StopStringMatcher(("ab",))
    assert m2.feed("xa") == ("x", False) and m2.flush() == "a"


def test_eos_token_ends_the_request_and_is_not_in_the_text(engine):
    from app.engine.request import Request
    from app.engine.sequence import Sequence

    eos = engine.spec.eos_token_ids[-1]
    hello = engine.tokenizer.encode("Hello")
    seq = Sequence(Request([1, 2, 3], SamplingParams(max_tokens=10)), engine.tokenizer, engine.spec.vocab_size,
                   frozenset(engine.spec.eos_token_ids))
    for tok in hello:
        seq.accept(tok, engine.max_context)
        assert seq.finished is None
    seq.accept(eos, engine.max_context)
    res = seq.result()
    assert seq.finished == "stop" and res.finish_reason == "stop"
    assert res.text == "Hello" and res.token_ids[-1] == eos


def test_batched_greedy_equals_sequential(engine):
    prompts = [[{"role": "user", "content": f"Question number {i}: why is the sky blue?"}] for i in range(6)]
    sequential = [engine.chat(p, greedy(20)).wait(60).token_ids for p in prompts]
    gens = [engine.chat(p, greedy(20)) for p in prompts]  # 6 requests over 4 slots
    assert [g.wait(60).token_ids for g in gens] == sequential


def test_cancel_from_another_thread(engine):
    gen = engine.chat(CHAT, greedy(200))
    first = next(iter(gen))
    threading.Thread(target=gen.cancel).start()
    rest = "".join(gen)
    res = gen.result
    assert res.finish_reason == "cancelled"
    assert res.text == first + rest and len(res.token_ids) < 200
    assert engine.stats()["running"] == 0


def test_interactive_request_preempts_background_work(tiny_qwen_dir):
    with Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=1, max_context=256) as e:
        long = e.chat(CHAT, greedy(150), priority=PRIORITY_BACKGROUND)
        next(iter(long))  # the long request is running
        urgent = e.chat([{"role": "user", "content": "Quick!"}], greedy(5), priority=PRIORITY_INTERACTIVE)
        urgent_res = urgent.wait(60)
        assert not long.done, "the interactive request should finish before the long one"
        long_res = long.wait(120)
        alone = e.chat(CHAT, greedy(150)).wait(120)
    assert urgent_res.usage.completion_tokens == 5
    assert long_res.usage.completion_tokens == 150
    # Preemption recomputes the long request's cache; its text stays a continuation of the same prompt.
    assert long_res.token_ids[:5] == alone.token_ids[:5]


def test_prompt_past_context_is_refused_before_queueing(engine):
    with pytest.raises(ContextLengthError) as info:
        engine.generate(list(range(300)), greedy(5))
    assert info.value.limit == 255 and info.value.requested == 300
    assert "255" in str(info.value)


def test_generation_stops_at_the_context_end(engine):
    prompt = list(range(1000, 1000 + 250))
    res = engine.generate(prompt, greedy(100)).wait(60)
    assert res.finish_reason == "length" and res.usage.completion_tokens == 256 - 250


def test_kv_cache_refuses_positions_past_its_end(engine):
    with pytest.raises(ContextLengthError):
        engine.runner.prefill(0, [1, 2, 3], 254)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=-0.1), dict(top_p=1.5), dict(max_tokens=0),
                                 dict(top_k=-2), dict(repetition_penalty=0.009),
                                 dict(stop=("",)), dict(presence_penalty=3), dict(seed=2**64)])
def test_invalid_sampling_params_name_the_parameter(bad):
    with pytest.raises(InvalidParameterError) as info:
        SamplingParams(**bad)
    assert info.value.param == next(iter(bad))


def test_close_frees_the_model_while_the_engine_object_lives(tiny_qwen_dir):
    """A model switch closes the old engine, then plans the new one against the free memory: the
    weights and the KV cache must go at close, not when the last reference to the engine does."""
    import gc
    import weakref

    from app.errors import EngineClosedError

    e = Engine.load(tiny_qwen_dir, device="cpu", max_batch_size=2, max_context=256)
    e.chat(CHAT, greedy(3)).wait(60)
    runner = weakref.ref(e.runner)
    e.close()
    gc.collect()
    assert runner() is None
    with pytest.raises(EngineClosedError):
        e.chat(CHAT, greedy(3))
