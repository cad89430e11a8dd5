"""End to end: hostile constraints against a real `gclm serve` over real sockets (issue 55).

Each attack of bench/hostile.py's catalogue is answered 400 or 429 within the compile
timeout plus 5 s, never a 5xx; /health keeps answering throughout; a small new constraint
sent beside heavy ones is answered; the server's RSS stays within its budgets; SIGTERM
ends the server and every process it started. The server runs with a 4 s compile timeout
(the default is 10) so that the module takes a minute or two, not five.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bench._server import GclmServer
from bench.hostile import ATTACKS, HealthWatch, grammar, normal, rss_mb, send

pytestmark = pytest.mark.e2e

TIMEOUT_S = 4.0
CACHE_MIB = 512
# What the server may hold past its start: the cache's budget, and 1.5 GB for everything
# else (a grow in flight, the model's activations, the allocator's slack).
RSS_ALLOWANCE_MB = CACHE_MIB + 1536
# A /health answer on a loaded 2-core CI machine: the target is 1 s (bench/hostile.py
# reports the figure); the test allows twice that so a busy machine does not fail it.
HEALTH_MAX_S = 2.0


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[GclmServer]:
    extra = ("--compile-timeout", str(TIMEOUT_S), "--cache-memory", str(CACHE_MIB))
    with GclmServer(max_batch=4, extra_args=extra) as server:
        yield server
        log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def baseline_rss(hostile_server: GclmServer) -> float:
    """The server's RSS once it has served one small constrained request."""
    assert hostile_server.process is not None
    with httpx.Client(timeout=120.0) as client:
        status, _, code = send(client, hostile_server.url, normal(1))
        assert status == 200, code
    return rss_mb(hostile_server.process.pid)[0]


@pytest.mark.parametrize("name", list(ATTACKS))
def test_an_attack_is_a_400_or_a_429_in_time(
    hostile_server: GclmServer, baseline_rss: float, name: str
) -> None:
    assert hostile_server.process is not None
    with HealthWatch(hostile_server.url) as health, httpx.Client(timeout=120.0) as client:
        status, seconds, code = send(client, hostile_server.url, ATTACKS[name]())
    assert status in (400, 429), (status, code)
    assert code in ("compile_limit", "compiler_busy", "budget_too_small", "invalid_grammar") or (
        status == 400
    ), code
    assert seconds < TIMEOUT_S + 5, seconds
    assert health.max_s < HEALTH_MAX_S, health.max_s
    rss = rss_mb(hostile_server.process.pid)[0]
    assert rss < baseline_rss + RSS_ALLOWANCE_MB, (rss, baseline_rss)


def test_a_small_constraint_beside_heavy_ones_is_answered(hostile_server: GclmServer) -> None:
    """After every attack (their compiles may still run in the background), with four more
    heavy constraints in flight, a small new grammar is answered. The target is 5 s
    (bench/hostile.py reports it); on a loaded CI machine the test allows the compile
    timeout more."""
    heavy = [grammar(f'start: ("{c}"~1000)~1000') for c in "cd"]
    heavy += [grammar('start: ("e".."z"~1000)~900'), grammar('start: (("f"~100)~100)~99')]
    answers: list[tuple[int, float, str]] = []

    def post(body: dict) -> None:
        with httpx.Client(timeout=120.0) as client:
            answers.append(send(client, hostile_server.url, body))

    threads = [threading.Thread(target=post, args=(body,)) for body in heavy]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    with httpx.Client(timeout=120.0) as client:
        status, seconds, code = send(client, hostile_server.url, normal(int(time.time())))
    for thread in threads:
        thread.join()
    assert status == 200, code
    assert seconds < 5.0 + TIMEOUT_S + 5, seconds
    assert all(answer[0] in (400, 429) for answer in answers), answers


def test_sigterm_ends_the_server_and_its_workers() -> None:
    """SIGTERM while a heavy compile runs and a client waits on it: the server exits within
    its shutdown timeout (plus the pool's close), and nothing it started survives it."""
    with GclmServer(max_batch=2, extra_args=("--shutdown-timeout", "3")) as server:
        process = server.process
        assert process is not None
        waiting = threading.Thread(
            target=lambda: send(httpx.Client(timeout=60.0), server.url, ATTACKS["repeat_class"]()),
            daemon=True,
        )
        waiting.start()
        time.sleep(1.5)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        took = time.monotonic() - started
        session = process.pid  # GclmServer starts it in a session of its own
    assert took < 3 + 10, took
    time.sleep(1.0)
    listed = subprocess.run(
        ["ps", "-o", "pid=,stat=,args=", "-s", str(session)], capture_output=True, text=True
    ).stdout.splitlines()
    # An exited process whose parent is gone waits for init to reap it (<defunct>): it holds
    # nothing; a live one would.
    left = [line for line in listed if line.split()[1][0] != "Z"]
    assert not left, "left running after the server:\n" + "\n".join(left)
