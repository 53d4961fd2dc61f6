"""Incremental detokenization that never emits a broken UTF-8 character.

Byte-level BPE splits a Chinese character or an emoji across tokens; decoding a prefix then
ends in U+FFFD. We decode a short window of recent tokens and emit only the new text once
it no longer ends in a replacement character (the approach of TGI/vLLM), which also keeps
SentencePiece's leading-space handling right. An answer cut off by its token limit in the
middle of a character ends without that half character, never with "\ufffd".
"""

from __future__ import annotations

from app.engine.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
# A byte-level token holds at most a few bytes of one character; after this many tokens an
# undecodable tail is genuinely invalid output and is emitted as is.
_MAX_HELD_TOKENS = 8


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_tail: list[int] | None = None):
        self.tokenizer = tokenizer
        # Decoding starts with a few prompt tokens as context so the first output token's
        # leading space is kept (SentencePiece strips it at the start of a decode).
        self.ids: list[int] = list(prompt_tail or [])[-4:]
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        """Feed one generated token; return the text it completes (maybe empty)."""
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset:])
        held = len(self.ids) - self.read_offset
        if len(full) <= len(prefix) or (full.endswith(_REPLACEMENT) and held < _MAX_HELD_TOKENS):
            return ""  # nothing new yet, or half a character: hold the tokens back
        new_text = full[len(prefix):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        return new_text

    def flush(self) -> str:
        """The complete characters still held back at the end of generation.

        What is held back ends in an incomplete UTF-8 sequence (the answer stopped in the
        middle of a character); that half character has no text, so it is dropped.
        """
        if self.read_offset == len(self.ids):
            return ""
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):].rstrip(_REPLACEMENT)
