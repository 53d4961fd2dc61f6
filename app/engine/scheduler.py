"""Continuous batching over a fixed set of KV-cache slots, on one worker thread.

Each step: admit waiting requests into free slots (lowest priority value first, then
arrival), preempting a lower-priority running request if an interactive one is waiting and
no slot is free; prefill a chunk of the prompts still prefilling (at most the runner's
``prefill_chunk`` tokens in all: most urgent first, then the fewest tokens left, so a short
request that arrives during a long prompt's prefill is served between its chunks); run one
decode step for every sequence that is decoding; sample, stream, and retire finished or
cancelled requests.

The runner's optional abilities (tokens taken on the device and steps launched ahead,
sampled tokens drawn there, guessed tokens checked) are used exactly where its
``capabilities`` grant them (app.engine.runner.RunnerCapabilities).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading

from app.engine.lookup import SequenceLookup
from app.engine.request import Request
from app.engine.runner import Runner
from app.engine.sequence import Sequence
from app.engine.tokenizer import Tokenizer
from app.errors import EngineClosedError

log = logging.getLogger(__name__)

# Decode steps whose tokens the device takes (argmax, or a draw without penalties) are chained
# on the device for at most this many sequences (decode_tokens_launch_next).
# Through the HTTP server chaining paid at 1, 2 and 4 streams; at 8 streams it measured lower in
# most paired runs (not significant, not understood: docs/SERVER.md), so 8-sequence steps keep the
# one-step-ahead flow.
CHAIN_MAX_SEQUENCES = 4
# Tokens guessed from the sequence itself per step at most (app.engine.lookup): 7 guesses are
# a step of 8 rows, one block of mma columns in the GEMVs (rows 9-16 take a second one).
LOOKUP_MAX_DRAFT = 7


class Scheduler:
    def __init__(self, runner: Runner, tokenizer: Tokenizer, vocab_size: int, eos_ids: frozenset[int],
                 lookup_draft: int = LOOKUP_MAX_DRAFT):
        self.runner = runner
        self.capabilities = runner.capabilities
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.prefill_chunk = self.capabilities.prefill_chunk
        self._cond = threading.Condition()
        self._waiting: list[tuple[int, int, Sequence]] = []  # heap of (priority, arrival, seq)
        self._arrival = itertools.count()
        self._running: list[Sequence] = []
        self.num_slots = runner.num_slots
        self._free_slots = list(range(runner.num_slots))
        self._closed = False
        self.speculative_hits = 0  # steps whose tokens were ready when the scheduler came for them
        # Guessed tokens checked per step (0: never guess): only with a runner that checks
        # several tokens of one sequence in one step, bit-equal to one at a time.
        self.max_draft = max(0, min(lookup_draft, self.capabilities.max_verify_rows - 1))
        self.lookup_guessed = 0  # tokens guessed and checked
        self.lookup_kept = 0  # of those, equal to the model's own argmax
        self._thread = threading.Thread(target=self._loop, name="qwen-tray-scheduler", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        seq = Sequence(request, self.tokenizer, self.vocab_size, self.eos_ids)
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is shut down")
            heapq.heappush(self._waiting, (request.priority, next(self._arrival), seq))
            self._cond.notify()

    def stats(self) -> dict:
        with self._cond:
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "slots": self.num_slots, "free_slots": len(self._free_slots),
                    "speculative_hits": self.speculative_hits, "lookup_guessed": self.lookup_guessed,
                    "lookup_kept": self.lookup_kept}

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if not self._thread.is_alive():
            self.runner = None  # the weights and the KV cache go now, not with the engine's last reference

    # -- the worker thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    break
                self._admit()
            try:
                self._step()
            except Exception as error:  # a bug or device failure: fail the requests, keep serving
                log.exception("engine step failed")
                for seq in list(self._running):
                    self._retire(seq, error)
        self._fail_all(EngineClosedError("the engine was shut down before the request finished"))

    def _admit(self) -> None:
        """Move waiting requests into free slots; preempt for a more urgent request. Holds the lock."""
        while self._waiting:
            priority, _, seq = self._waiting[0]
            if not self._free_slots:
                victim = max(self._running, key=lambda s: (s.priority, s.submitted_at), default=None)
                if victim is None or victim.priority <= priority:
                    return
                self._preempt(victim)
            heapq.heappop(self._waiting)
            seq.slot = self._free_slots.pop(0)
            seq.cached = 0
            self._running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Give ``seq``'s slot away; it re-runs its tokens (prompt + output so far) later."""
        self._running.remove(seq)
        self._free_slots.append(seq.slot)
        seq.slot, seq.cached = None, 0
        heapq.heappush(self._waiting, (seq.priority, next(self._arrival), seq))

    def _step(self) -> None:
        with self._cond:
            cancelled = [s for _, _, s in self._waiting if s.handle.cancelled]
            if cancelled:
                self._waiting = [e for e in self._waiting if not e[2].handle.cancelled]
                heapq.heapify(self._waiting)
        for seq in cancelled + [s for s in self._running if s.handle.cancelled]:
            seq.cancel()
            self._retire(seq)
        prefilling = [s for s in self._running if not s.is_decoding]
        if prefilling:
            self._settle_in_flight()  # before a slot's new owner runs: no stale match below
            self._prefill(prefilling)
        decoding = [s for s in self._running if s.is_decoding and s.finished is None]
        if decoding:
            self._decode(decoding)

    def _prefill(self, prefilling: list[Sequence]) -> None:
        """This step's prefill: the next chunk of each prompt in turn, most urgent first, then
        the fewest tokens left (a short prompt is not kept waiting behind a long one; two long
        ones go in arrival order, as the one ahead has fewer left), while the chunks fit in
        ``prefill_chunk`` tokens (the first always runs). A prompt is always cut every
        ``prefill_chunk`` tokens from its start, whatever runs beside it: its arithmetic, so
        its output, is the same as alone."""
        budget = self.prefill_chunk
        for seq in sorted(prefilling, key=lambda s: (s.priority, len(s.pending), s.submitted_at)):
            size = min(len(seq.pending), self.prefill_chunk)
            if size > budget and budget < self.prefill_chunk:
                continue  # a smaller one further on may still fit
            self._prefill_chunk(seq)
            budget -= size
            if budget <= 0:
                return

    def _prefill_chunk(self, seq: Sequence) -> None:
        chunk = seq.pending[: self.prefill_chunk]
        logits = self.runner.prefill(seq.slot, chunk, seq.cached)
        seq.cached += len(chunk)
        if seq.cached == len(seq.all_ids):  # all its tokens are in: sample the next one
            self._accept(seq, logits)

    def _decode(self, seqs: list[Sequence]) -> None:
        if len(seqs) == 1 and self._decode_guessed(seqs[0]):
            return
        args = ([s.slot for s in seqs], [s.all_ids[-1] for s in seqs], [s.cached for s in seqs])
        # the tokens taken on the device (B ids cross the bus), pipelined, when the runner can:
        # the argmax, or a draw without penalties (RequestSampler.row)
        rows = [s.sampler.row for s in seqs]
        if self.capabilities.pipelined_decode and all(self._on_device(r) for r in rows):
            for seq, row in zip(seqs, rows):
                self.runner.set_sampling(seq.slot, row)
            return self._decode_pipelined(seqs, *args)
        self._drop_speculative()
        for seq, row in zip(seqs, self.runner.decode(*args)):
            seq.cached += 1
            self._accept(seq, row)

    def _on_device(self, row) -> bool:
        """Whether the runner takes this request's tokens itself (argmax, or a draw)."""
        return row is not None and (row.temperature == 0 or self.capabilities.draw_on_device)

    def _decode_pipelined(self, seqs: list[Sequence], slots: list[int], ids: list[int], positions: list[int]) -> None:
        """Decode ahead of the host, the tokens taken on the device (argmax or draw): the next
        step is launched before this step's tokens are accepted, so the host's bookkeeping
        overlaps the GPU.

        When the oldest step in flight is exactly this step (same sequences, same positions,
        at most CHAIN_MAX_SEQUENCES of them), the step after it is launched at once from its
        tokens on the device (the runner's ``decode_tokens_launch_next``), and only then are
        this step's tokens waited for: the GPU always has the next step queued. Otherwise a
        step in flight is used when it covers every sequence here at the same position
        (sequences that finished since are simply not asked for), and the next one is launched
        from the host's tokens; anything else is discarded — its cache writes are the ones this
        step makes again, or lie past the end of a finished sequence — and this step runs now.
        """
        keys = list(zip(slots, positions))
        in_flight = self.runner.decode_tokens_in_flight()
        room = all(p + 1 < self.runner.max_context for p in positions)
        exact = bool(in_flight) and list(zip(*in_flight[0])) == keys  # the oldest in flight is this step
        chained = room and exact and len(keys) <= CHAIN_MAX_SEQUENCES
        if chained and len(in_flight) == 1:  # (a second one in flight is already the chained step)
            self.runner.decode_tokens_launch_next()
        ready = self.runner.decode_tokens_collect()
        if all(k in ready for k in keys):
            self.speculative_hits += 1
            tokens = [ready[k] for k in keys]
        else:
            tokens = self.runner.decode_tokens(slots, ids, positions)  # drops what is still in flight
        if room and not chained:
            self.runner.decode_tokens_launch(slots, tokens, [p + 1 for p in positions])
        for seq, token in zip(seqs, tokens):
            seq.cached += 1
            self._accept_token(seq, token)

    def _decode_guessed(self, seq: Sequence) -> bool:
        """One step that checks tokens guessed from the sequence itself (app.engine.lookup):
        each row's token is the one decoding would take there (the argmax, or the draw of that
        position: ``RequestSampler.check``, on the device where the runner can), a guess is
        kept while it equals it, and the row after the last guess kept gives one more token.
        So the text is the same as without guessing. False when nothing was guessed: the
        caller decodes as usual."""
        if self.max_draft < 1 or not self._guess(seq):
            return False
        self._settle_in_flight()  # their tokens come first (and may finish the sequence)
        if seq.finished is not None:
            return True
        draft = self._guess(seq)
        if not draft:
            return False
        rows = [seq.all_ids[-1], *draft]
        if self._on_device(seq.sampler.row):  # the argmax or the draw of every row, on the device
            tokens = self.runner.tokens_rows(seq.slot, rows, seq.cached, seq.sampler.row)
            checked = ((token, i < len(draft) and token == draft[i]) for i, token in enumerate(tokens))
        else:
            logits = self.runner.logits_rows(seq.slot, rows, seq.cached)
            checked = (seq.sampler.check(logits[i], draft[i], len(seq.all_ids)) if i < len(draft)
                       else (seq.sampler.sample(logits[i], len(seq.all_ids)), False)
                       for i in range(len(rows)))  # lazily: each row sees the tokens accepted before it
        kept = 0
        for token, is_guess in checked:
            seq.cached += 1
            self._accept_token(seq, token)
            kept += is_guess
            if seq.finished is not None or not is_guess:
                break  # rows past a token that was not the guess saw the wrong token
        seq.lookup.length.update(len(draft), kept)
        self.lookup_guessed += len(draft)
        self.lookup_kept += kept
        return True

    def _guess(self, seq: Sequence) -> list[int]:
        """Tokens to check after ``seq``'s last one, within its context and max_tokens."""
        if seq.lookup is None:
            seq.lookup = SequenceLookup(seq.all_ids, self.max_draft)
        room = min(self.runner.max_context - 1 - seq.cached, seq.params.max_tokens - seq.generated - 1)
        return seq.lookup.guess(room) if room > 0 else []

    def _settle_in_flight(self) -> None:
        """Accept the tokens of the decode steps still in flight instead of discarding them
        (before a prefill): they were launched for sequences that are still decoding, and the
        next decode would compute the same tokens again. A token counts only for the sequence
        decoding in that slot at that position (a slot whose owner finished or was preempted
        since matches nothing: its new owner is still prefilling)."""
        if not self.capabilities.pipelined_decode:
            return
        while ready := self.runner.decode_tokens_collect():  # oldest step first, {} when none is left
            waiting_for = {(s.slot, s.cached): s for s in self._running if s.is_decoding and s.finished is None}
            for key, token in ready.items():
                seq = waiting_for.get(key)
                if seq is not None:
                    seq.cached += 1
                    self._accept_token(seq, token)

    def _drop_speculative(self) -> None:
        """Wait for and discard the steps launched ahead (before anything else uses the runner)."""
        if self.capabilities.pipelined_decode:
            while self.runner.decode_tokens_collect():  # {} when nothing is in flight
                pass

    def _accept(self, seq: Sequence, logits) -> None:
        self._accept_token(seq, seq.sampler.sample(logits, len(seq.all_ids)))

    def _accept_token(self, seq: Sequence, token: int) -> None:
        seq.accept(token, self.runner.max_context)
        if seq.finished is not None:
            self._retire(seq)

    def _retire(self, seq: Sequence, error: BaseException | None = None) -> None:
        with self._cond:
            if seq in self._running:
                self._running.remove(seq)
                self._free_slots.append(seq.slot)
                self._free_slots.sort()
        if error is not None:
            seq.handle._fail(error)
        else:
            seq.handle._finish(seq.result())

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            pending = [s for _, _, s in self._waiting] + self._running
            self._waiting.clear()
            self._running.clear()
        for seq in pending:
            seq.handle._fail(error)
