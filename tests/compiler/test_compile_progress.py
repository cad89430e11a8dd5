"""The Retry-After of a compile running in the background, from the progress its worker
reports: the estimate itself, that it never moves earlier on a guess, that the walk reports,
and that a real background compile's retry at its Retry-After gets the table."""

from __future__ import annotations

import time

import numpy as np
import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.service.compile_job import (
    MIN_RETRY_S,
    QUEUED,
    Job,
    remaining_cpu,
    running_estimate,
)
from gclm.compiler.service.pool import CompilerPool
from gclm.compiler.service.progress import DONE, FINISH, PHASE, PREPARE, TOTAL, WALK, Progress
from gclm.compiler.service.worker import CompileLimits
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import CompilerBusyError

ABC = TokenVocabulary((b"a", b"b", b"ab", None), 3, "plain")


def test_in_the_walk_its_own_rate_weighs_more_as_it_goes() -> None:
    # 1 s of CPU before the walk, 2 s walking a quarter of 40,000 states: 30,000 left are
    # guessed at 9 s (300 us each) and measured at 6 s; weighted by the square root of the
    # share walked (a half), plus a tenth of the walk for what follows it.
    progress = Progress(WALK, done=10_000, total=40_000, walk_cpu_s=1.0)
    assert remaining_cpu(3.0, progress) == pytest.approx(7.5 + 0.1 * 9.5)
    # Three quarters walked in the same CPU: mostly the measured two thirds of a second.
    late = Progress(WALK, 30_000, 40_000, 1.0)
    weight = 0.75**0.5
    left = (1 - weight) * 3.0 + weight * 2 / 3
    assert remaining_cpu(3.0, late) == pytest.approx(left + 0.1 * (2 + left))
    # All but one state: what follows the walk.
    assert remaining_cpu(3.0, Progress(WALK, 39_999, 40_000, 1.0)) == pytest.approx(0.2, abs=0.01)
    # Nothing walked yet: the guess alone.
    assert remaining_cpu(1.1, Progress(WALK, 0, 40_000, 1.0)) == pytest.approx(12 + 1.21)


def test_before_the_walk_and_after_it() -> None:
    # In the DFA: its walk is guessed at eight times the DFA's CPU so far.
    assert remaining_cpu(4.0, Progress(PREPARE)) == 32.0
    assert remaining_cpu(0.05, Progress(PREPARE)) == 0.5
    assert remaining_cpu(11.0, Progress(FINISH, 400, 400, 1.0)) == pytest.approx(1.0)


def test_the_estimate_is_at_the_cpu_rate_the_compile_gets_and_within_its_ceiling() -> None:
    progress = Progress(WALK, done=10_000, total=40_000, walk_cpu_s=1.0)
    # 3 s of CPU in 6 s of wall time: half a core, so 8.45 CPU seconds take 16.9 s.
    assert running_estimate(3.0, 6.0, 60.0, progress) == pytest.approx(16.9)
    # A ceiling 2 CPU seconds away ends it sooner (with a 400), at the same rate.
    assert running_estimate(3.0, 6.0, 5.0, progress) == pytest.approx(4.0)
    assert running_estimate(3.0, 6.0, 3.0, progress) == MIN_RETRY_S


def test_the_announced_end_moves_earlier_only_on_progress() -> None:
    job = Job(Constraint.regex("a"), "k")
    assert job.retry_after(100.0, 30.0, (WALK, 10)) == 30.0  # ends at 130
    # Five seconds later, a lower guess with no progress since: the end stands.
    assert job.retry_after(105.0, 10.0, (WALK, 10)) == 25.0
    # A later end is always told.
    assert job.retry_after(106.0, 40.0, (WALK, 10)) == 40.0  # ends at 146
    # The walk went on: its estimate may bring the end forward.
    assert job.retry_after(107.0, 10.0, (WALK, 20)) == 10.0
    assert job.retry_after(108.0, 1.0, (FINISH, 20)) == MIN_RETRY_S
    queued = Job(Constraint.regex("b"), "q")
    assert queued.retry_after(0.0, 8.0, (QUEUED, -3)) == 8.0
    assert queued.retry_after(1.0, 2.0, (QUEUED, -3)) == 7.0
    assert queued.retry_after(2.0, 2.0, (QUEUED, 0)) == 2.0  # moved up the queue


def test_a_compile_reports_its_walk_over_the_byte_dfa_states() -> None:
    slots = np.zeros(4, dtype=np.int64)
    table = compile_constraint(Constraint.regex("(ab){1,20}"), ABC, progress=slots)
    assert slots[PHASE] == FINISH
    states = table.accepting.shape[0]
    # Every state reached was walked; the total is the byte DFA's, which bounds them.
    assert states - 1 <= slots[DONE] < slots[TOTAL] + 1 and slots[TOTAL] >= states


def medium(i: int) -> Constraint:
    """Twelve bounded free-text fields: ~3 s of CPU on a quiet core (six took 1.5 s on
    2026-12-04, under the 2 s timeout below), almost all in the walk."""
    props = {f"r{j}_{i}": {"type": "string", "maxLength": 400} for j in range(12)}
    return Constraint.json_schema({"type": "object", "properties": props})


def test_a_retry_at_the_retry_after_gets_the_table(embedded_vocab) -> None:
    timeout = 2.0
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=timeout, cpu_s=120), workers=1)
    try:
        assert pool.wait_ready(120)
        cache = TableCache(pool.submit, embedded_vocab.fingerprint)
        constraint = medium(time.time_ns())
        answer = cache.fetch(constraint)
        busy = answer.exception(timeout=300)
        assert isinstance(busy, CompilerBusyError)
        retry_after = busy.retry_after
        assert retry_after >= MIN_RETRY_S
        time.sleep(retry_after)
        # The retry waits at most the timeout for a compile still running: it must end
        # within that (before, the guess was "as long again as so far", about 2 s here for
        # a compile that needs 5 s or more of CPU, and the retry was another 429).
        table = cache.get(constraint)
        assert table is answer.outcome.result(0)
    finally:
        pool.close()
