"""A real vLLM engine core killed under `gclm serve --engine vllm`: /health turns 503 and
requests get a 503 `engine_dead` saying so, so that a supervisor restarts the server.
Runs in vLLM's environment (`make test-vllm`), with a server of its own."""

from __future__ import annotations

import importlib.util
import os
import signal
import time

import httpx
import pytest

from bench._server import GclmServer

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def engine_cores(pid: int) -> list[int]:
    """The server's vLLM engine-core processes (vLLM names them "EngineCore...")."""
    import psutil  # a vLLM dependency

    children = psutil.Process(pid).children(recursive=True)
    return [c.pid for c in children if "EngineCore" in " ".join([c.name(), *c.cmdline()])]


def test_a_killed_engine_core_fails_health_and_requests_with_503() -> None:
    if importlib.util.find_spec("vllm") is None:
        message = "vLLM is not installed in this environment; run `make test-vllm`"
        if os.environ.get("GCLM_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    server = GclmServer(
        max_batch=2,
        extra_args=("--engine", "vllm", "--enforce-eager", "on", "--max-model-len", "512"),
        startup_timeout=420.0,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "1"},
    )
    with server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert server.process is not None
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2}
        assert http.post("/v1/completions", json=body).status_code == 200
        cores = engine_cores(server.process.pid)
        assert cores, f"no vLLM engine core under the server:\n{server.log_tail()}"
        for pid in cores:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (health := http.get("/health")).status_code == 200:
            assert time.monotonic() < deadline, "/health still 200 a minute after the kill"
            time.sleep(0.5)
        assert health.status_code == 503, health.text
        assert health.json()["error"]["code"] == "engine_dead"
        refused = http.post("/v1/completions", json=body)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "engine_dead" and "engine core died" in error["message"]
