"""The embedded model made to think, served once for the session: `gclm serve` with the
thinking chat template (templates/think.jinja) and `--reasoning-parser deepseek_r1`.

test_e2e_reasoning.py asks it through the SDK, and test_bench_reasoning.py hands it to
bench.reasoning's quick run (which asks for exactly this server): one start instead of two.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._server import GclmServer

TEMPLATE = (Path(__file__).parent / "templates" / "think.jinja").resolve()
MAX_BATCH = 8
ARGS = (
    "--reasoning-parser", "deepseek_r1", "--chat-template", str(TEMPLATE),
    "--compile-timeout", "120",  # a loaded machine must not time the compile out
)  # fmt: skip


@pytest.fixture(scope="session")
def thinking_server() -> Iterator[GclmServer]:
    """The thinking server; at the session's end its log must hold no traceback."""
    with GclmServer(max_batch=MAX_BATCH, extra_args=ARGS) as server:
        yield server
        log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"
