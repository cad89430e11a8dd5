"""Prompts admitted and not yet prefilled, for the engine thread.

A distinct prompt gets a KV slot at admission, holding as much of it as the store has (a
kept prefix), and the rest is prefilled in one of two places: a chunk per engine step,
beside the running rows (`schedule`, `take`, `finished`), or, for one prompt at a time with
many tokens left, on the side thread (side_prefill.py: `start_side`, `collect_side`). The
other choices of a prompt being prefilled (n > 1) wait on it, each promised a slot that
copies its own once the prompt is in. `Prefills` keeps that bookkeeping; it runs no forward
pass of the engine's, and only the engine thread calls it.
"""

from __future__ import annotations

import logging
import time

import torch

from gclm.errors import InternalError
from gclm.server.engine.transformers.kv_store import KVStore
from gclm.server.engine.transformers.sequence import Sequence
from gclm.server.engine.transformers.side_prefill import SIDE_MIN_TOKENS, SidePrefill

log = logging.getLogger("gclm.engine")


class Prefills:
    """The prompts waiting for their first token (module docstring)."""

    def __init__(self, kv: KVStore, slots: dict[Sequence, int], side: SidePrefill | None):
        """`kv`, `slots`: the engine's KV store and the slot each sequence owns (shared);
        `side`: the side thread, or None (every prompt prefilled by the steps)."""
        self.kv = kv
        self.slots = slots
        self.side = side
        self.rests: dict[Sequence, list[int]] = {}  # each prompt's tokens left, a chunk a step
        self.followers: dict[Sequence, Sequence] = {}  # a choice -> the prompt it waits on
        self.counts: dict[str, float] = {
            "side_prefills": 0,
            "side_prefill_tokens": 0,
            "side_prefill_seconds": 0.0,
        }

    def __len__(self) -> int:
        """Distinct prompts being prefilled."""
        return len(self.rests) + (self.side_seq is not None)

    @property
    def side_seq(self) -> Sequence | None:
        """The prompt the side thread holds (prefilling, or done and not yet collected)."""
        return None if self.side is None else self.side.seq

    @property
    def busy(self) -> bool:
        """Whether a step has prefill work: chunks to feed, or a prompt the side thread
        finished (one it is still prefilling wakes the engine when it is done)."""
        return bool(self.rests) or (self.side is not None and self.side.finished)

    @property
    def packs(self) -> bool:
        """Whether a step may run a packed pass: not while the side thread runs (packed.py
        switches the model's attention function, and the thread would see it)."""
        return self.side is None or not self.side.running

    @property
    def remaining(self) -> int:
        """Prompt tokens the steps have left to feed."""
        return sum(map(len, self.rests.values()))

    def admit(self, seq: Sequence) -> None:
        """Give a distinct prompt a slot holding as much of it as the store has, or make a
        choice of a prompt being prefilled wait on it."""
        prompt = seq.request.prompt_ids
        side = self.side_seq
        leaders = [*self.rests, *([side] if side is not None else [])]
        leader = next((p for p in leaders if p.request.prompt_ids == prompt), None)
        if leader is not None:
            self.followers[seq] = leader
            return
        slot = self.slots[seq] = self.kv.claim(prompt)
        self.kv.reserve(len(prompt) + seq.request.params.max_tokens)
        seq.cached_tokens = len(self.kv.tokens[slot])
        self.rests[seq] = prompt[seq.cached_tokens :]

    def start_side(self) -> int:
        """Hand the oldest prompt with SIDE_MIN_TOKENS or more left to the side thread, when
        it is free; returns the tokens it will prefill (0: none)."""
        if self.side is None or not self.side.free:
            return 0
        long = [s for s, rest in self.rests.items() if len(rest) >= SIDE_MIN_TOKENS]
        if not long:
            return 0
        seq = long[0]
        rest = self.rests.pop(seq)
        self.side.start(seq, self.kv, self.slots[seq], rest)
        self.counts["side_prefills"] += 1
        self.counts["side_prefill_tokens"] += len(rest)
        return len(rest)

    def schedule(self, budget: int) -> dict[Sequence, int]:
        """How many of its tokens each prompt feeds this step, oldest first, `budget` in
        all."""
        chunks: dict[Sequence, int] = {}
        for seq, rest in self.rests.items():
            if budget <= 0:
                break
            chunks[seq] = min(len(rest), budget)
            budget -= chunks[seq]
        return chunks

    def take(self, chunks: dict[Sequence, int]) -> dict[int, list[int]]:
        """The tokens `chunks` feeds, by slot; they are no longer left."""
        fed: dict[int, list[int]] = {}
        for seq, n in chunks.items():
            fed[self.slots[seq]] = self.rests[seq][:n]
            del self.rests[seq][:n]
        return fed

    def finished(self, chunks: dict[Sequence, int]) -> tuple[list[Sequence], list[int]]:
        """The sequences whose prompt this step's `chunks` finished, with the choices that
        copy their slot now, and for each the index of its prompt's chunk in `chunks`."""
        ready: list[Sequence] = []
        rows: list[int] = []
        for i, leader in enumerate(chunks):
            if self.rests[leader]:
                continue
            del self.rests[leader]
            seqs = self._with_followers(leader)
            ready += seqs
            rows += [i] * len(seqs)
        return ready, rows

    def collect_side(self) -> tuple[list[tuple[Sequence, torch.Tensor]], list[Sequence]]:
        """The prompt the side thread finished, in its slot now, with the choices that
        waited on it, each with the logits after the prompt [V] (none while it runs); and
        the prompt to evict when its prefill failed (it and its choices have failed: a bug
        or an out-of-memory fails that request only)."""
        leader = self.side_seq
        if self.side is None or leader is None or not self.side.finished:
            return [], []
        started = self.side.started
        try:
            logits = self.side.collect(self.kv, self.slots[leader])
        except Exception as e:
            log.exception("prefill on the side thread failed")
            error = InternalError(f"Prefill failed: {e!r}")
            waiting = [f for f, of in self.followers.items() if of is leader]
            for seq in (leader, *waiting):
                self.followers.pop(seq, None)
                seq.fail(error)
            return [], [leader]
        self.counts["side_prefill_seconds"] += time.perf_counter() - started
        return [(seq, logits) for seq in self._with_followers(leader)], []

    def drop_cancelled(self) -> list[Sequence]:
        """Finish cancelled choices waiting on a prompt, and stop cancelled prompts no live
        choice waits on; returns those prompts (their slots to free)."""
        for seq in [f for f in self.followers if f.cancelled]:
            del self.followers[seq]
            seq.finish("cancelled")
        waited = set(self.followers.values())
        gone = [s for s in self.rests if s.cancelled and s not in waited]
        for seq in gone:
            del self.rests[seq]
        side = self.side_seq
        if self.side is not None and side is not None and side.cancelled and side not in waited:
            self.side.abandon()
            gone.append(side)
        return gone

    def abandon(self) -> list[Sequence]:
        """Forget every prompt and choice (a failed step, a dead engine); returns them."""
        seqs = [*self.rests, *self.followers]
        if self.side is not None:
            side = self.side.abandon()
            seqs += [side] if side is not None else []
        self.rests.clear()
        self.followers.clear()
        return seqs

    def shutdown(self) -> None:
        if self.side is not None:
            self.side.shutdown()

    def _with_followers(self, leader: Sequence) -> list[Sequence]:
        """`leader`, whose prompt its slot now holds, and the choices that waited on it, each
        now holding a copy of that slot."""
        seqs = [leader]
        for seq in [f for f, of in self.followers.items() if of is leader]:
            del self.followers[seq]
            self.slots[seq] = self.kv.claim_copy(self.slots[leader])
            seqs.append(seq)
        return seqs
