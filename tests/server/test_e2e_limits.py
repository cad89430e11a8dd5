"""End to end: the adversarial probe's findings against a real `gclm serve` over real sockets.

Each test is one of the probe's problems: a 500 on an out-of-range seed, 429 for requests
that can never be admitted, no body size limit, a long prompt freezing the event loop, and
outlines-core's internal text for an empty integer range. The session's one server
(tests/server/e2e_server.py) serves them all.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from e2e_server import GclmServer

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def http(gclm_server: GclmServer):
    with httpx.Client(base_url=gclm_server.url, timeout=120.0) as client:
        yield client


def test_out_of_range_seed_is_a_400_and_keeps_the_connection(http: httpx.Client) -> None:
    for seed in (1 << 64, -(1 << 63) - 1):
        response = http.post(
            "/v1/chat/completions", json={"messages": MESSAGES, "seed": seed, "max_tokens": 1}
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "seed"
        assert response.headers.get("connection", "").lower() != "close"
    ok = http.post(
        "/v1/chat/completions",
        json={"messages": MESSAGES, "seed": (1 << 63) - 1, "n": 2, "max_tokens": 2},
    )
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2


def test_more_choices_than_the_queue_is_a_400(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": "Hi", "n": 128, "max_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "too_many_choices" and "--queue-size" in error["message"]
    assert "retry-after" not in response.headers


def test_head_health(http: httpx.Client) -> None:
    response = http.head("/health")
    assert response.status_code == 200 and response.content == b""


def test_body_over_the_limit_is_a_413(http: httpx.Client) -> None:
    big = b'{"prompt": "' + b"x" * (17 << 20) + b'"}'
    response = http.post(
        "/v1/completions", content=big, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_a_9_mb_prompt_does_not_block_health(http: httpx.Client, gclm_server: GclmServer) -> None:
    # The probe: a 9 MB prompt froze every request, /health included, for 5.6 s.
    latencies: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(base_url=gclm_server.url, timeout=30.0) as client:
            while not stop.is_set():
                started = time.perf_counter()
                client.get("/health").raise_for_status()
                latencies.append(time.perf_counter() - started)
                time.sleep(0.02)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        time.sleep(0.3)
        for endpoint, body in (
            ("/v1/completions", {"prompt": "word " * ((9 << 20) // 5)}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * (9 << 20)}]}),
        ):
            response = http.post(endpoint, json=body)
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"
        time.sleep(0.3)
    finally:
        stop.set()
        poller.join()
    assert len(latencies) > 5
    assert max(latencies) < 0.5, f"/health took up to {max(latencies):.2f} s"


def test_empty_integer_range_says_so(http: httpx.Client) -> None:
    schema = {"type": "integer", "minimum": 10, "maximum": 3}
    response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "guided_json": schema})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "lower bound is above the upper one" in message and "encoding" not in message


def test_metrics_show_the_cache_budget_and_the_compile_pool(http: httpx.Client) -> None:
    text = http.get("/metrics").text
    for name in (
        "gclm_table_cache_bytes",
        "gclm_table_cache_budget_bytes 5.36870912e+08",
        "gclm_table_disk_bytes",
        "gclm_table_disk_budget_bytes",
        "gclm_compile_processes",
        "gclm_compile_queue_depth",
    ):
        assert name in text


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 10**30}),
        ("/v1/completions", {"prompt": [[1, 10**30]], "max_tokens": 1}),
        ("/v1/completions", {"prompt": [1, 2**63], "max_tokens": 1}),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2**64, "guided_regex": "a+"}),
        ("/v1/chat/completions", {"messages": MESSAGES, "temperature": 1e308, "max_tokens": 1}),
    ],
)
def test_huge_numbers_are_400s(http: httpx.Client, endpoint: str, body: dict) -> None:
    # Numbers that reach torch or numpy are checked against what those can hold.
    response = http.post(endpoint, json=body)
    assert response.status_code == 400, response.text
