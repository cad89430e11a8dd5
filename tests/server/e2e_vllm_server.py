"""`gclm serve --engine vllm` for the vLLM end-to-end tests, started once for several modules.

test_e2e_vllm.py runs the SDK suite on it, then test_e2e_vllm_dies.py (collected after it)
takes the same server and kills its engine core: one vLLM start (~1-2 min on two cores)
instead of two. A taken server is never handed out again: a later `get()` starts a new one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

import pytest

from bench._server import GclmServer

# A fresh eager start takes ~30-60 s on 2 cores; the model's weights are loaded once.
STARTUP_TIMEOUT_S = 420.0


def need_vllm() -> None:
    """Skip (or, under GCLM_REQUIRE_VLLM=1, fail) where vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        message = "vLLM is not installed in this environment; run `make test-vllm`"
        if os.environ.get("GCLM_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


class VllmGclmServers:
    """Hands out one running `gclm serve --engine vllm` (eager, max batch 8, vLLM's threads
    bound to one core), starting it on first use; stops every server it started at the end."""

    def __init__(self) -> None:
        self._current: GclmServer | None = None
        self._started: list[GclmServer] = []

    def get(self) -> GclmServer:
        """The shared server, started on first use (or after one was taken)."""
        if self._current is None:
            need_vllm()
            bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "1")
            server = GclmServer(
                max_batch=8,
                extra_args=("--engine", "vllm", "--enforce-eager", "on", "--max-model-len", "2048"),
                startup_timeout=STARTUP_TIMEOUT_S,
                env={"VLLM_CPU_OMP_THREADS_BIND": bind, "VLLM_CPU_KVCACHE_SPACE": "1"},
            )
            self._started.append(server)
            self._current = server.start()
        return self._current

    @contextlib.contextmanager
    def taken(self) -> Iterator[GclmServer]:
        """The shared server, for a test that breaks it: stopped when the block ends, and
        never returned by a later `get()`."""
        server, self._current = self.get(), None
        try:
            yield server
        finally:
            server.stop()

    def close(self) -> None:
        for server in self._started:
            server.stop()


@pytest.fixture(scope="session")
def vllm_gclm_servers() -> Iterator[VllmGclmServers]:
    servers = VllmGclmServers()
    try:
        yield servers
    finally:
        servers.close()
