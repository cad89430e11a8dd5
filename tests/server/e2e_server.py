"""The end-to-end fixture: a real `gclm serve` (embedded model, CPU) for the whole session.

The process launcher is shared with the serving benchmark (`bench/_server.py`).
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from bench._server import GclmServer

MAX_BATCH = 8


@pytest.fixture(scope="session")
def gclm_server() -> Iterator[GclmServer]:
    """A running server (max batch 8); `.url` is its base URL, without /v1.

    At the end of the session, the server must not have logged a traceback (a failed engine
    step, an exception in the app) even where every client saw a proper answer.
    """
    with GclmServer(max_batch=MAX_BATCH) as server:
        yield server
        log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def client(gclm_server: GclmServer) -> Iterator[openai.OpenAI]:
    """The openai SDK on the module's server, no retries: every answer is the server's own."""
    with openai.OpenAI(
        base_url=f"{gclm_server.url}/v1", api_key="x", timeout=300.0, max_retries=0
    ) as client:
        yield client
