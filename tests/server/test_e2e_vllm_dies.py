"""A real vLLM engine core killed under `gclm serve --engine vllm`: /health turns 503 and
requests get a 503 `engine_dead` saying so, so that a supervisor restarts the server.
Runs in vLLM's environment (`make test-vllm`), on the server test_e2e_vllm.py used (taken
from tests/server/e2e_vllm_server.py, so that no later test is handed it dead)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from e2e_vllm_server import VllmGclmServers

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def engine_cores(pid: int) -> list[int]:
    """The server's vLLM engine-core processes (vLLM names them "EngineCore...")."""
    import psutil  # a vLLM dependency

    children = psutil.Process(pid).children(recursive=True)
    return [c.pid for c in children if "EngineCore" in " ".join([c.name(), *c.cmdline()])]


def test_a_killed_engine_core_fails_health_and_requests_with_503(
    vllm_gclm_servers: VllmGclmServers,
) -> None:
    with (
        vllm_gclm_servers.taken() as server,  # test_e2e_vllm.py's, when it ran before
        httpx.Client(base_url=server.url, timeout=60) as http,
    ):
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
