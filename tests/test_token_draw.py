"""The device draw (app/kernels/token_draw.py): the sampled token of every row, without a sort
— at a temperature alone (``temperature_draw``, temperature_draw.cu) and with top-k / top-p
(``filtered_draw``, filtered_draw.cu). The temperature draw's reference (``temperature_draw_ref``, the CPU path)
equals the host sampler's arithmetic exactly; the kernels, marked ``gpu``, against the float64
distribution of the same logits on fresh random inputs (ties included), with the rows each
must leave alone checked untouched."""

from __future__ import annotations

import pytest
import torch

from app.engine.sampling import sample_rows, uniform
from app.kernels.reference import temperature_draw_ref

# (temperature, top_p, top_k) per row: drawn here, argmax, top-p and top-k rows left alone
ROW_KINDS = [(0.3, 1.0, 0), (0.0, 1.0, 0), (1.0, 0.9, 0), (0.7, 1.0, 40), (1.3, 1.0, 0), (0.05, 1.0, 0)]
CDF_TOLERANCE = 1e-4  # of the total: the GPU's sums round differently (tests/test_device_sampling.py)
SENTINEL = -7


def poison(workspace) -> None:
    for t in workspace.tensors():
        t.fill_(-7 if t.dtype == torch.int32 else float("nan"))


def draws_here(temperature: float, top_p: float, top_k: int) -> bool:
    return temperature > 0 and top_p >= 1 and top_k <= 0


def make_params(kinds, seed: int, position: int) -> torch.Tensor:
    """fp32 [4, rows]: temperature, top_p, top_k, u (app.engine.cuda.draw DRAW_INPUTS)."""
    rows = [(t, p, float(k), uniform(seed + i, position)) for i, (t, p, k) in enumerate(kinds)]
    return torch.tensor(rows, dtype=torch.float32).t().contiguous()


def random_logits(rows: int, ld: int, gen: torch.Generator, scale: float = 3.0) -> torch.Tensor:
    return (torch.randn(rows, ld, generator=gen) * scale).half()


def test_reference_draws_what_the_host_sampler_draws():
    """Row by row the same token as sample_rows (the host sampler's arithmetic), at many
    positions; argmax, top-k and top-p rows keep what ``out`` holds."""
    gen = torch.Generator().manual_seed(3)
    vocab = 2000
    for position in range(30):
        logits = random_logits(len(ROW_KINDS), vocab + 48, gen)  # + padded ids past the vocab
        params = make_params(ROW_KINDS, 50, position)
        out = torch.full((len(ROW_KINDS),), SENTINEL, dtype=torch.int64)
        temperature_draw_ref(logits, vocab, params, out)
        for i, (t, p, k) in enumerate(ROW_KINDS):
            if not draws_here(t, p, k):
                assert out[i] == SENTINEL
                continue
            want = torch.tensor([SENTINEL])
            sample_rows(logits[i:i + 1, :vocab], params[0, i:i + 1], params[1, i:i + 1], params[2, i:i + 1].long(),
                        params[3, i:i + 1], want, filtered=False)
            assert out[i] == want[0], (position, i)


def test_reference_never_draws_nan_or_minus_infinity():
    logits = torch.full((3, 64), float("-inf"), dtype=torch.float16)
    logits[0, 5] = logits[0, 9] = 1.0
    logits[0, 7] = float("nan")
    logits[1, 3] = float("nan")  # nothing drawable in row 1, nor in row 2 (all -inf)
    params = make_params([(1.0, 1.0, 0)] * 3, 8, 0)
    for u in (0.0, 0.49, 0.51, 0.999):
        params[3] = u
        out = torch.full((3,), SENTINEL, dtype=torch.int64)
        temperature_draw_ref(logits, 64, params, out)
        assert out[0] in (5, 9) and out[1] == SENTINEL and out[2] == SENTINEL


def test_the_workspace_is_what_the_vram_plan_counts():
    """draw_workspace_bytes (the plan's decode buffers count it) is what draw_workspace allocates."""
    from app.kernels.token_draw import draw_workspace, draw_workspace_bytes

    for rows in (1, 5, 16):
        assert draw_workspace(rows, "cpu").nbytes == draw_workspace_bytes(rows)


def holds_the_point(logits_row: torch.Tensor, temperature: float, u: float, token: int) -> bool:
    """Whether ``token`` holds u x total in the float64 cumulative softmax(l / T), give or take
    CDF_TOLERANCE of the total, and has a positive probability."""
    probs = torch.softmax(logits_row.double() / temperature, -1)
    cdf = probs.cumsum(0)
    x = u * float(cdf[-1])
    low, high = (float(cdf[token - 1]) if token else 0.0), float(cdf[token])
    slack = CDF_TOLERANCE * float(cdf[-1])
    return bool(probs[token] > 0) and low - slack <= x <= high + slack


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,ld,rows", [(151_665, 151_936, 6), (152_064, 152_064, 16), (3_000, 3_008, 1),
                                           (17, 24, 6), (1, 8, 2)])
def test_kernel_draws_within_rounding_of_the_distribution(vocab, ld, rows):
    """Fresh random fp16 logits (ties included: fp16 has few values), rows of every kind, many
    positions: each drawn token holds the draw's point; rows not drawn keep their poison; most
    tokens equal the reference's; the same inputs give the same tokens again."""
    from app.kernels import temperature_draw, draw_workspace

    gen = torch.Generator().manual_seed(vocab + rows)
    kinds = [ROW_KINDS[i % len(ROW_KINDS)] for i in range(rows)]
    workspace = draw_workspace(rows, "cuda")
    equal = total = 0
    for position in range(24):
        logits = random_logits(rows, ld, gen, scale=1.0 + position % 4)
        params = make_params(kinds, 1000 + vocab, position)
        poison(workspace)  # nothing from an earlier launch may leak in
        out = torch.full((rows,), SENTINEL, dtype=torch.int64, device="cuda")
        temperature_draw(logits.cuda(), vocab, params.cuda(), workspace=workspace, out=out)
        got = out.cpu()
        again = torch.full((rows,), SENTINEL, dtype=torch.int64, device="cuda")
        temperature_draw(logits.cuda(), vocab, params.cuda(), workspace=workspace, out=again)
        assert torch.equal(again.cpu(), got)  # deterministic
        want = temperature_draw_ref(logits, vocab, params, torch.full((rows,), SENTINEL, dtype=torch.int64))
        for i, (t, p, k) in enumerate(kinds):
            if not draws_here(t, p, k):
                assert got[i] == SENTINEL
                continue
            assert 0 <= got[i] < vocab
            assert holds_the_point(logits[i, :vocab], t, float(params[3, i]), int(got[i])), (position, i)
            equal += int(got[i] == want[i])
            total += 1
    assert equal >= 0.9 * total, (equal, total)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_draws_follow_the_distribution(device):
    """One row with six likely tokens and a long tail, drawn at 4,000 uniform numbers (the
    reference on the CPU, the kernel on the GPU): the frequencies of the six and of the tail
    together match softmax(l / T) within 4.5 sigma."""
    vocab, draws, t = 5_000, 4_000, 0.7
    gen = torch.Generator().manual_seed(11)
    row = random_logits(1, vocab, gen, scale=1.0)
    row[0, :6] = torch.tensor([6.0, 5.5, 5.0, 4.0, 4.0, 3.0], dtype=torch.float16)
    logits = row.expand(draws, vocab).contiguous()
    params = make_params([(t, 1.0, 0)] * draws, 0, 0)
    params[3] = torch.rand(draws, generator=gen)
    out = torch.zeros(draws, dtype=torch.int64)
    if device == "cpu":
        temperature_draw_ref(logits, vocab, params, out)
    else:
        from app.kernels import temperature_draw, draw_workspace

        got = out.cuda()
        temperature_draw(logits.cuda(), vocab, params.cuda(), workspace=draw_workspace(draws, "cuda"),
                         out=got)
        out = got.cpu()
    probs = torch.softmax(row[0].double() / t, -1)
    want = torch.cat([probs[:6], probs[6:].sum(0, keepdim=True)])  # the six, then the tail as one
    counts = torch.bincount(out, minlength=vocab).double()
    freq = torch.cat([counts[:6], counts[6:].sum(0, keepdim=True)]) / draws
    assert torch.all((freq - want).abs() <= 4.5 * (want * (1 - want) / draws).sqrt()), (freq, want)


@pytest.mark.gpu
def test_kernel_leaves_rows_with_nothing_drawable_and_never_draws_nan():
    from app.kernels import temperature_draw, draw_workspace

    logits = torch.full((3, 4096), float("-inf"), dtype=torch.float16)
    logits[0, 100] = logits[0, 3000] = 2.0
    logits[0, 2000] = float("nan")
    logits[1, 7] = float("nan")
    params = make_params([(1.0, 1.0, 0)] * 3, 8, 0)
    workspace = draw_workspace(3, "cuda")
    for u in (0.0, 0.25, 0.75, 0.99999):
        params[3] = u
        out = torch.full((3,), SENTINEL, dtype=torch.int64, device="cuda")
        temperature_draw(logits.cuda(), 4096, params.cuda(), workspace=workspace, out=out)
        got = out.tolist()
        assert got[0] == (100 if u < 0.5 else 3000) and got[1:] == [SENTINEL, SENTINEL]


@pytest.mark.gpu
def test_kernels_replay_in_a_cuda_graph():
    """Both draws captured once, replayed on new logits and uniform numbers written into the
    same buffers: the tokens of eager launches on the same inputs."""
    from app.kernels import draw_workspace, filtered_draw, temperature_draw

    kinds = [(0.3, 1.0, 0), (0.7, 0.9, 0), (1.0, 0.9, 50), (0.0, 1.0, 0)]
    rows, vocab = len(kinds), 151_936
    gen = torch.Generator().manual_seed(5)
    logits = random_logits(rows, vocab, gen).cuda()
    params = make_params(kinds, 2, 0).cuda()
    workspace = draw_workspace(rows, "cuda")
    out = torch.zeros(rows, dtype=torch.int64, device="cuda")

    def both(into):
        temperature_draw(logits, vocab, params, workspace=workspace, out=into)
        filtered_draw(logits, vocab, params, workspace=workspace, out=into)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        both(out)  # compiled before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            both(out)
    torch.cuda.synchronize()
    for position in range(1, 6):
        logits.copy_(random_logits(rows, vocab, gen))
        params.copy_(make_params(kinds, 2, position))
        out.zero_()
        graph.replay()
        replayed = out.clone()
        eager = torch.zeros_like(out)
        both(eager)
        assert torch.equal(replayed, eager), position


# -- top-k / top-p ---------------------------------------------------------------------------------

FILTERED_KINDS = [(0.7, 0.9, 0), (1.0, 1.0, 5), (1.1, 0.8, 40), (0.3, 1.0, 0), (0.0, 0.9, 0), (0.9, 0.5, 1),
                  (1.3, 0.95, 0), (0.6, 0.6, 200)]  # top-p, top-k, both; a temperature-only and an argmax row


def filtered_probabilities(logits_row: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """The host sampler's filters (app.engine.sampling.probabilities) in float64."""
    from app.engine.sampling import probabilities

    scaled = (logits_row.double() / temperature)[None]
    return probabilities(scaled, torch.tensor([top_p], dtype=torch.float64), torch.tensor([top_k]), True)[0]


def holds_the_filtered_point(probs: torch.Tensor, u: float, token: int) -> bool:
    cdf = probs.cumsum(0)
    x = u * float(cdf[-1])
    low, high = (float(cdf[token - 1]) if token else 0.0), float(cdf[token])
    slack = CDF_TOLERANCE * float(cdf[-1])
    return bool(probs[token] > 0) and low - slack <= x <= high + slack


@pytest.mark.gpu
@pytest.mark.parametrize("vocab,ld,levels", [(151_665, 151_936, 0), (3_000, 3_008, 0), (3_000, 3_008, 12),
                                             (40, 48, 3), (1, 8, 0)])
def test_filtered_kernel_keeps_what_the_host_sampler_keeps(vocab, ld, levels):
    """Fresh random fp16 logits (``levels``: rounded to that many values, so the filters cut
    through ties), rows of every kind, many positions: each drawn token is one the host's
    filters keep and holds the draw's point; temperature-only and argmax rows keep their
    poison; most tokens equal sample_rows'; the same inputs give the same tokens again."""
    from app.engine.sampling import sample_rows
    from app.kernels import draw_workspace, filtered_draw

    rows = len(FILTERED_KINDS)
    gen = torch.Generator().manual_seed(vocab + levels)
    workspace = draw_workspace(rows + 3, "cuda")  # more rows than the step: the kernels index by its rows
    equal = total = 0
    for position in range(16):
        logits = random_logits(rows, ld, gen, scale=1.0 + position % 3)
        if levels:
            logits = (logits.float() * levels / 4).round().div(levels / 4).half()
        params = make_params(FILTERED_KINDS, 77 + vocab, position)
        poison(workspace)
        out = torch.full((rows,), SENTINEL, dtype=torch.int64, device="cuda")
        filtered_draw(logits.cuda(), vocab, params.cuda(), workspace=workspace, out=out)
        again = torch.full((rows,), SENTINEL, dtype=torch.int64, device="cuda")
        filtered_draw(logits.cuda(), vocab, params.cuda(), workspace=workspace, out=again)
        got = out.cpu()
        assert torch.equal(again.cpu(), got)  # deterministic
        for i, (t, p, k) in enumerate(FILTERED_KINDS):
            if not (t > 0 and (p < 1 or k > 0)):
                assert got[i] == SENTINEL
                continue
            assert 0 <= got[i] < vocab
            probs = filtered_probabilities(logits[i, :vocab], t, p, k)
            assert holds_the_filtered_point(probs, float(params[3, i]), int(got[i])), (position, i, int(got[i]))
            want = torch.tensor([SENTINEL])
            sample_rows(logits[i:i + 1, :vocab], params[0, i:i + 1], params[1, i:i + 1], params[2, i:i + 1].long(),
                        params[3, i:i + 1], want, filtered=True)
            equal += int(got[i] == want[0])
            total += 1
    assert equal >= 0.9 * total, (equal, total)


@pytest.mark.gpu
def test_filtered_kernel_cuts_ties_in_index_order():
    """Ten tied most likely logits and top-p 0.35: the stable sort keeps the first four by
    index (0.1 mass each: 0, 0.1, 0.2, 0.3 ahead of them), never the other six; top-k 3 with
    three ties at the third value keeps all five."""
    from app.kernels import draw_workspace, filtered_draw

    vocab = 4096
    logits = torch.full((2, vocab), float("-inf"), dtype=torch.float16)
    tied = torch.tensor([7, 100, 900, 1500, 2047, 2048, 3000, 3500, 4000, 4095])
    logits[0, tied] = 1.0
    logits[1, [10, 20]] = 3.0
    logits[1, [5, 30, 4000]] = 2.0
    logits[1, 50] = 1.0
    workspace = draw_workspace(2, "cuda")
    seen = [set(), set()]
    for j in range(200):
        params = make_params([(1.0, 0.35, 0), (1.0, 1.0, 3)], 5, j)
        out = torch.zeros(2, dtype=torch.int64, device="cuda")
        filtered_draw(logits.cuda(), vocab, params.cuda(), workspace=workspace, out=out)
        for i, token in enumerate(out.tolist()):
            seen[i].add(token)
    assert seen[0] == set(tied[:4].tolist())
    assert seen[1] == {5, 10, 20, 30, 4000}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_filtered_draws_follow_the_distribution(device):
    """One row drawn at 4,000 uniform numbers with top-p 0.8 and top-k 5 (the host sampler on
    the CPU, the kernel on the GPU): the five kept tokens' frequencies match the filtered
    distribution within 4.5 sigma and nothing else comes."""
    from app.engine.sampling import sample_rows

    vocab, draws, t = 5_000, 4_000, 0.8
    gen = torch.Generator().manual_seed(12)
    row = random_logits(1, vocab, gen, scale=1.0)
    row[0, [3, 70, 500, 4000, 4999, 9]] = torch.tensor([6.0, 5.5, 5.0, 4.5, 4.5, 4.0], dtype=torch.float16)
    logits = row.expand(draws, vocab).contiguous()
    params = make_params([(t, 0.8, 5)] * draws, 0, 0)
    params[3] = torch.rand(draws, generator=gen)
    out = torch.zeros(draws, dtype=torch.int64)
    if device == "cpu":
        sample_rows(logits, params[0], params[1], params[2].long(), params[3], out, filtered=True)
    else:
        from app.kernels import draw_workspace, filtered_draw

        got = out.cuda()
        filtered_draw(logits.cuda(), vocab, params.cuda(), workspace=draw_workspace(draws, "cuda"), out=got)
        out = got.cpu()
    want = filtered_probabilities(row[0], t, 0.8, 5)
    freq = torch.bincount(out, minlength=vocab).double() / draws
    assert torch.all(freq[want == 0] == 0)
    assert torch.all((freq - want).abs() <= 4.5 * (want * (1 - want) / draws).sqrt() + 1e-12), (freq[want > 0], want[want > 0])
