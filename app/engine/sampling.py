"""Turning one request's logits into its next token.

Order (as in transformers): repetition penalty → presence/frequency penalties →
temperature → top-k → top-p → draw. The draw takes one uniform number per token from
:func:`uniform`, a pure function of the request's seed and the token's position: the same
seed gives the same text whatever else runs in the batch, whether the runner draws on the
host or on the device (:func:`sample_rows`, the CUDA runner's decode step), with guessed
tokens checked or not (:meth:`RequestSampler.check`); a preempted request that re-runs its
positions draws the same numbers again.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from app.engine.params import SamplingParams

_MASK64 = (1 << 64) - 1


def uniform(seed: int, position: int) -> float:
    """A number in [0, 1), exact in float32 (24 bits), from (seed, position) alone: SplitMix64's
    finalizer over a Weyl step per position (counter-based, no state to advance)."""
    z = (seed + 0x9E3779B97F4A7C15 * (position + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 40) / float(1 << 24)


@dataclass(frozen=True, slots=True)
class RowSampling:
    """What a runner needs to draw a request's tokens itself (no penalties: they need the
    request's token counts). ``temperature == 0``: the argmax."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    vocab: int  # tokens that may be drawn: the first ``vocab`` logits (RequestSampler.vocab_size)

    @property
    def filtered(self) -> bool:
        """Top-k or top-p apply: the draw sorts the row."""
        return self.top_k > 0 or self.top_p < 1.0


def probabilities(scaled: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor, filtered: bool) -> torch.Tensor:
    """Rows of float32 logits already divided by the temperature [n, V] → probabilities [n, V]
    in vocabulary order after top-k (``top_k`` [n] int64, 0 = off; ties with the k-th value
    stay) and top-p (``top_p`` [n]: the smallest set of most likely tokens whose mass reaches
    it). ``filtered`` False: no row filters (nothing is sorted)."""
    if not filtered:
        return torch.softmax(scaled, dim=-1)
    vocab = scaled.shape[-1]
    vals, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # [n, V]; ties in index order
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)  # [n]
    kth = vals.gather(1, (k - 1)[:, None])  # [n, 1]
    vals.masked_fill_(vals < kth, float("-inf"))
    probs = torch.softmax(vals, dim=-1)  # [n, V], sorted
    ahead = probs.cumsum(-1).sub_(probs)  # mass of the more likely tokens
    remove = ahead >= top_p[:, None]
    remove[:, 0] = False  # the most likely token always stays
    probs.masked_fill_(remove, 0.0)
    probs.div_(probs.sum(-1, keepdim=True))
    return torch.zeros_like(probs).scatter_(1, order, probs)


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, a token with probability proportional to ``weights`` [n, V] (>= 0, not all 0)
    for the uniform numbers ``u`` [n]: the first index whose cumulative weight exceeds
    u x total, so a token of weight 0 is never drawn. (torch.multinomial costs several times as
    much for Qwen's 152k tokens on a CPU: lab/bench_sampling.py.)"""
    cdf = weights.cumsum(-1)  # [n, V]
    x = u.to(cdf.dtype)[:, None] * cdf[:, -1:]  # [n, 1]
    return torch.searchsorted(cdf, x, right=True).squeeze(1).clamp_(max=weights.shape[-1] - 1)


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                u: torch.Tensor, argmax: torch.Tensor, filtered: bool) -> None:
    """The token of each row, drawn where it is (CUDA graph buffers, no host round trip):
    ``logits`` [n, V] (any float dtype), per-row ``temperature`` / ``top_p`` / ``top_k`` /
    ``u`` [n]; ``argmax`` [n] int64 holds the rows' argmax and receives the tokens (a row at
    temperature 0 keeps its argmax). The same arithmetic as :meth:`RequestSampler.sample`."""
    sampled = temperature > 0  # [n]
    scaled = logits.float() / torch.where(sampled, temperature, 1.0)[:, None]  # [n, V]
    tokens = draw(probabilities(scaled, top_p, top_k, filtered), u)
    torch.where(sampled, tokens, argmax, out=argmax)


class RequestSampler:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab_size: int):
        self.params = params
        self.vocab_size = vocab_size
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.seed = seed % 2**64  # negative seeds are fine too
        self.prompt_ids = torch.tensor(sorted(set(prompt_ids)), dtype=torch.long)
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32)
        p = params
        # A greedy request reaches every runner as temperature 0 (the argmax): a device draw never
        # divides by a tiny temperature nor searches an empty nucleus (SamplingParams.greedy).
        self._settings = RowSampling(0.0 if p.greedy else p.temperature, p.top_p, p.top_k, self.seed, vocab_size)
        self.has_penalties = p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)
        # How a runner draws this request's tokens itself (read every decode step); None with
        # penalties: they need this request's token counts, so those draws stay on the host.
        self.row: RowSampling | None = None if self.has_penalties else self._settings

    def observe(self, token_id: int) -> None:
        """Record a generated token (for the penalties)."""
        self.output_counts[token_id] += 1

    def sample(self, logits: torch.Tensor, position: int) -> int:
        """logits [V] (any device, any float dtype) → the token at ``position`` (the sequence's
        length before it: the draw's counter)."""
        logits = self._penalized(logits)
        if self.params.greedy:
            return int(torch.argmax(logits))
        return self._draw(self._probabilities(logits), uniform(self.seed, position))

    def check(self, logits: torch.Tensor, guess: int, position: int) -> tuple[int, bool]:
        """The token at ``position`` when ``guess`` was proposed for it (app.engine.lookup), and
        whether it is the guess: the token :meth:`sample` draws, kept as the guess when equal.
        For a guess certain of itself that is speculative sampling's rule — the guess is kept
        with probability p(guess), otherwise the token follows p without it — and it makes a
        token a function of the seed, the position and the logits alone: a request's text is
        the same with guessing on or off, and whatever else runs."""
        token = self.sample(logits, position)
        return token, token == guess

    @staticmethod
    def _draw(weights: torch.Tensor, u: float) -> int:
        return int(draw(weights[None], torch.tensor([u]))[0])

    def _penalized(self, logits: torch.Tensor) -> torch.Tensor:
        """A float32 CPU copy of ``logits`` with the repetition and presence/frequency penalties."""
        p = self.params
        logits = logits.detach().to("cpu", torch.float32)[: self.vocab_size].clone()
        if p.repetition_penalty != 1.0:
            seen = torch.unique(torch.cat([self.prompt_ids, self.output_counts.nonzero().flatten()]))
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            logits -= p.frequency_penalty * self.output_counts + p.presence_penalty * (self.output_counts > 0).float()
        return logits

    def _probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p, softmax: probabilities [V] (modifies ``logits``)."""
        p = self.params
        scaled = logits.div_(p.temperature)[None]  # [1, V]
        top_k = min(p.top_k, scaled.shape[-1])  # any k past the vocabulary keeps it all (and fits an int64)
        return probabilities(scaled, torch.tensor([p.top_p]), torch.tensor([top_k]), self._settings.filtered)[0]
