"""Stop strings that may span token boundaries.

Text that could be the beginning of a stop string is held back until it either completes
the stop string (generation ends; the stop string is not returned) or stops matching.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add generated text; return (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self.held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buf[: min(hits)], True
        keep = self._longest_partial_match(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """At the end of generation, the held text was not a stop string after all."""
        text, self.held = self.held, ""
        return text

    def _longest_partial_match(self, buf: str) -> int:
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
