"""The Retry-After a busy compile is answered with: exact values of the estimates."""

from __future__ import annotations

import pytest

from gclm.compiler.service.compile_job import MIN_RETRY_S, queued_estimate, running_estimate


def test_a_running_compile_in_its_dfa_needs_its_walk_at_its_rate() -> None:
    # 2 s of CPU in 8 s of wall: a quarter of a core; no progress reported (the DFA): a
    # walk of eight times its CPU is guessed (tests/compiler/test_compile_progress.py), and
    # 16 s more of CPU take 64 s.
    assert running_estimate(2.0, 8.0, cpu_ceiling=30.0) == pytest.approx(64.0)


def test_a_running_compile_is_over_by_its_ceiling() -> None:
    # 9 s of CPU in 18 s, 1 s left below a 10 s ceiling: over in 2 s, table or 400.
    assert running_estimate(9.0, 18.0, cpu_ceiling=10.0) == pytest.approx(2.0)


def test_a_starved_compile_is_not_promised_a_fast_answer() -> None:
    # Hardly any CPU yet: at least half a second of CPU, at no less than a 20th of a core.
    assert running_estimate(0.0, 5.0, cpu_ceiling=10.0) == pytest.approx(10.0)


def test_a_queued_compile_waits_for_the_rounds_ahead_of_it() -> None:
    assert queued_estimate(0, workers=2, typical_s=3.0) == pytest.approx(3.0)
    assert queued_estimate(5, workers=2, typical_s=3.0) == pytest.approx(9.0)


def test_no_estimate_is_below_a_second() -> None:
    assert running_estimate(0.1, 0.1, cpu_ceiling=0.2) == MIN_RETRY_S
    assert queued_estimate(0, workers=1, typical_s=0.01) == MIN_RETRY_S
