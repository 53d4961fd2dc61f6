"""The scheduler's greedy pipeline on the CudaRunner: steps launched ahead of the host, chained
on the device, settled at arrivals; the tokens always equal running each request alone, and no
decode step is computed twice. Each test runs on the CPU (ReferenceOps) and, marked ``gpu``, on
CUDA, where the steps in flight really are asynchronous (events, pinned buffers, graphs)."""

from __future__ import annotations

import threading

import pytest


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_engine_greedy_through_decode_tokens_equals_logits_argmax(engine_parts, model_dir, device):
    """The scheduler's device-argmax seam gives what sampling the logits would."""
    from app.engine import SamplingParams

    loaded, engine_type, runner = engine_parts(model_dir, slots=2, max_context=128, device=device)
    prompt = loaded.tokenizer.encode("The capital of France is")
    calls = []  # "host": ids uploaded from the host, "device": the next step chained on the device
    runner.decode_tokens_launch = lambda *a, _f=runner.decode_tokens_launch: calls.append("host") or _f(*a)
    runner.decode_tokens_launch_next = lambda _f=runner.decode_tokens_launch_next: calls.append("device") or _f()
    engine = engine_type(loaded, runner, 2)
    with engine:
        out = engine.generate(prompt, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)).result
        hits = engine.stats()["speculative_hits"]
    want, pos, token = [], len(prompt), int(runner.prefill(0, prompt, 0).argmax())
    for _ in range(12):
        want.append(token)
        token, pos = int(runner.decode([0], [token], [pos])[0].argmax()), pos + 1
    # 11 decode steps: the first runs now and the second is launched from its tokens on the
    # host; from then on each step launches the one after it from the device before its own
    # tokens are read (10 hits), and the step launched after the last token is discarded.
    assert list(out.token_ids) == want and hits == 10
    assert calls == ["host", "host"] + ["device"] * 10


@pytest.mark.parametrize("device", DEVICES)
def test_pipelined_greedy_decode_survives_finishes_and_arrivals(engine_parts, model_dir, device):
    """Requests that finish (subset of the step launched ahead) or arrive (prefill: the step in
    flight is settled first) mid-stream still give exactly the tokens they give alone."""
    from app.engine import SamplingParams

    loaded, engine_type, runner = engine_parts(model_dir, slots=3, max_context=128, device=device)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    lengths = [3, 14, 8]
    with engine_type(loaded, runner, 3) as engine:
        def run(i):
            return engine.generate(prompts[i], SamplingParams(max_tokens=lengths[i], temperature=0, ignore_eos=True))
        alone = [list(run(i).result.token_ids) for i in range(3)]
        handles = [run(i) for i in range(3)]
        together = [list(h.result.token_ids) for h in handles]
        hits = engine.stats()["speculative_hits"]
    assert together == alone and [len(t) for t in together] == lengths and hits > 0


@pytest.mark.parametrize("device", DEVICES)
def test_only_small_greedy_batches_are_chained_on_the_device(engine_parts, model_dir, device):
    """Steps of more than CHAIN_MAX_SEQUENCES sequences keep the one-step-ahead flow (ids from
    the host); smaller ones are chained; the tokens are the same either way."""
    from app.engine import SamplingParams
    from app.engine.scheduler import CHAIN_MAX_SEQUENCES

    n = CHAIN_MAX_SEQUENCES + 1
    loaded, engine_type, runner = engine_parts(model_dir, slots=n, max_context=64, device=device)
    chained_sizes = []
    runner.decode_tokens_launch_next = (
        lambda _f=runner.decode_tokens_launch_next: chained_sizes.append(len(runner.decode_tokens_in_flight()[0][0]))
        or _f())
    prompts = [[5 + i, 6 + i, 7 + i] for i in range(n)]
    lengths = [16] * (n - 1) + [24]  # n sequences together, then the last one alone
    with engine_type(loaded, runner, n) as engine:
        def run(i):
            return engine.generate(prompts[i], SamplingParams(max_tokens=lengths[i], temperature=0, ignore_eos=True))
        alone = [list(run(i).result.token_ids) for i in range(n)]
        chained_sizes.clear()
        handles = [run(i) for i in range(n)]
        together = [list(h.result.token_ids) for h in handles]
    assert together == alone
    assert chained_sizes and max(chained_sizes) <= CHAIN_MAX_SEQUENCES


@pytest.mark.parametrize("device", DEVICES)
def test_arrivals_settle_the_steps_in_flight_instead_of_recomputing_them(engine_parts, model_dir, device):
    """Eight clients send requests back to back, as the server benchmark does: every arrival
    prefills while other sequences have a greedy step in flight. Those steps' tokens are
    accepted, not thrown away and recomputed, so the decode rows run are the decode tokens
    plus at most two steps launched ahead of each request's end; the tokens equal alone."""
    from app.engine import SamplingParams

    loaded, engine_type, runner = engine_parts(model_dir, slots=8, max_context=128, device=device)
    rows = []
    runner._run_rows = lambda r, ids_on_device=False, _f=runner._run_rows: rows.append(len(r)) or _f(r, ids_on_device)
    jobs = [(c, r) for c in range(8) for r in range(3)]
    prompt = {job: [5 + job[0], 6 + job[1], 7, 8] for job in jobs}
    params = {job: SamplingParams(max_tokens=10 + 2 * job[0] + job[1], temperature=0, ignore_eos=True) for job in jobs}
    with engine_type(loaded, runner, 8) as engine:
        alone = {job: list(engine.generate(prompt[job], params[job]).result.token_ids) for job in jobs}
        rows.clear()
        together = {}

        def client(c):
            for r in range(3):
                together[c, r] = list(engine.generate(prompt[c, r], params[c, r]).result.token_ids)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert together == alone
    decode_tokens = sum(len(t) - 1 for t in together.values())  # the first token comes from the prefill
    assert decode_tokens <= sum(rows) <= decode_tokens + 2 * len(jobs)
