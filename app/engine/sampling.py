"""Turning one request's logits into its next token.

Order (as in transformers): repetition penalty → presence/frequency penalties →
temperature → top-k → top-p → draw. Each request has its own ``torch.Generator``, so the
same seed gives the same text whatever else runs in the batch.
"""

from __future__ import annotations

import secrets

import torch

from app.engine.params import SamplingParams


class RequestSampler:
    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab_size: int):
        self.params = params
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device="cpu")
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator.manual_seed(seed % 2**63)  # negative seeds are fine too
        self.prompt_ids = torch.tensor(sorted(set(prompt_ids)), dtype=torch.long)
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32)

    @property
    def plain_greedy(self) -> bool:
        """Greedy without penalties: the token is the argmax of the raw logits (a runner may take
        it on the device)."""
        p = self.params
        return p.greedy and p.repetition_penalty == 1.0 and not p.presence_penalty and not p.frequency_penalty

    def observe(self, token_id: int) -> None:
        """Record a generated token (for the penalties)."""
        self.output_counts[token_id] += 1

    def sample(self, logits: torch.Tensor) -> int:
        """logits [V] (any device, any float dtype) → token id."""
        logits = self._penalized(logits)
        if self.params.greedy:
            return int(torch.argmax(logits))
        return self._draw(self._probabilities(logits))

    def check(self, logits: torch.Tensor, guess: int) -> tuple[int, bool]:
        """The next token when ``guess`` was proposed for it (app.engine.lookup), and whether
        it is the guess. Greedy: the argmax. Sampling: speculative sampling with a guess that
        is certain of itself — keep it with probability p(guess), else draw from p without
        it — so the token is distributed exactly as :meth:`sample`'s."""
        logits = self._penalized(logits)
        if self.params.greedy:
            token = int(torch.argmax(logits))
            return token, token == guess
        probs = self._probabilities(logits)
        if float(torch.rand((), generator=self.generator)) < float(probs[guess]):
            return guess, True
        probs[guess] = 0.0
        return self._draw(probs), False

    def _draw(self, weights: torch.Tensor) -> int:
        """A token with probability proportional to ``weights`` (>= 0, not all 0): one uniform
        number through the cumulative sum. (torch.multinomial took 3.2 ms for Qwen's 152k
        tokens on the CI machine's CPU, this 0.14 ms: benchmarks/bench_sampling.py. A 7B
        step on the RTX 3050 is ~35-40 ms.)"""
        cdf = torch.cumsum(weights, 0)
        x = float(torch.rand((), generator=self.generator)) * float(cdf[-1])
        # first i with cdf[i] > x: a token of weight 0 is never picked
        return min(int(torch.searchsorted(cdf, torch.tensor([x]), right=True)), weights.numel() - 1)

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
        """Temperature, top-k, top-p, softmax (modifies ``logits``)."""
        p = self.params
        logits /= p.temperature
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits[logits < kth] = float("-inf")
        if p.top_p < 1.0:
            logits = _top_p_filter(logits, p.top_p)
        return torch.softmax(logits, dim=-1)


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability sums to >= top_p."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    remove = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # mass before this token already enough
    remove[0] = False
    sorted_logits[remove] = float("-inf")
    out = torch.empty_like(logits)
    out[order] = sorted_logits
    return out
