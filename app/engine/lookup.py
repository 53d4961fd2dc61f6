"""Draft tokens from the sequence itself (prompt lookup decoding).

What the tray is asked to do most (fix, rewrite, translate names, reformat a selection)
copies long spans of the prompt into the answer, and greedy decoding that loops copies its
own output. When the last few tokens occurred earlier in the sequence, the tokens that
followed them then are a good guess for what comes next. The runner checks a guess of k
tokens in one step of k + 1 rows (``CudaRunner.tokens_rows``) that costs little more than one
token on a memory-bound GPU; every guessed token that equals the token decoding takes at its
position (the argmax, or that position's draw) is kept, plus the token after the last one
kept. The output is exactly what decoding one token at a time gives (the rows are bit-equal
to one-at-a-time decoding, docs/ENGINE_API.md), only faster when guesses hit.

:class:`NgramLookup` indexes a growing list of ids incrementally (each call indexes only the
tokens added since), so a lookup costs O(n-gram size) per step, not O(sequence).
:class:`DraftLength` adapts how many tokens are guessed to how many were kept lately.
"""

from __future__ import annotations

NGRAM_MAX = 4  # the longest suffix matched first (fewer false guesses than short ones)
NGRAM_MIN = 2  # a single repeated token is too weak a hint to spend a wider step on


class NgramLookup:
    """Continuations of the sequence's last tokens from their latest earlier occurrence.

    ``ids`` is the live list (prompt + output) the sequence appends to; nothing is copied.
    """

    def __init__(self, ids: list[int], ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {ngram_min}..{ngram_max}")
        self.ids = ids
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> latest end index (exclusive) indexed
        self._indexed = 0  # n-grams ending at 1.._indexed are in _ends

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest suffix (n-gram) of ``ids`` that occurred
        before; [] when none did."""
        n_ids = len(self.ids)
        self._index_upto(n_ids - 1)  # every end but the suffix's own
        if k < 1:
            return []
        for n in range(min(self.ngram_max, n_ids - 1), self.ngram_min - 1, -1):
            end = self._ends.get(tuple(self.ids[n_ids - n:]))
            if end is not None:
                return self.ids[end:min(end + k, n_ids)]
        return []

    def _index_upto(self, last_end: int) -> None:
        ids = self.ids
        for end in range(self._indexed + 1, last_end + 1):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._ends[tuple(ids[end - n:end])] = end
        self._indexed = max(self._indexed, last_end)


class DraftLength:
    """How many tokens to guess next: up after a guess kept whole, down after one missed.

    A wider step costs more on a GPU that is not purely memory-bound (on a big GPU each row adds
    to every GEMV's latency chain, docs/KERNELS.md § Launch plan), so a sequence whose guesses keep
    missing falls back to short guesses; one that keeps copying climbs to ``maximum``.
    """

    def __init__(self, maximum: int, start: int = 4):
        if maximum < 1:
            raise ValueError(f"the longest guess must be at least 1 token, got {maximum}")
        self.maximum = maximum
        self.current = min(start, maximum)

    def update(self, guessed: int, kept: int) -> None:
        if guessed and kept == guessed:
            self.current = min(self.maximum, self.current * 2)
        elif guessed:
            self.current = max(1, min(self.current - 1, kept + 1))


class SequenceLookup:
    """One sequence's guesses: the n-gram index over its ids and its current guess length."""

    def __init__(self, ids: list[int], maximum: int):
        self.ngrams = NgramLookup(ids)
        self.length = DraftLength(maximum)

    def guess(self, limit: int) -> list[int]:
        """At most ``limit`` (and the current length) tokens; [] when nothing matches."""
        return self.ngrams.draft(min(self.length.current, limit))
