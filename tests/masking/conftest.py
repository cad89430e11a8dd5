"""The vLLM server fixture (vLLM's own OpenAI server with gclm's logits processor)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from vllm_server import need_vllm_environment

from bench._vllm import VllmServer


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """vLLM's own OpenAI server with gclm's logits processor, eager, max 16 sequences."""
    need_vllm_environment()
    with VllmServer(logits_processor=True, max_num_seqs=16) as server:
        yield server
        log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, f"vLLM logged an exception:\n{log[-4000:]}"
