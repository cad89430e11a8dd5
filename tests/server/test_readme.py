"""Every Python block in README.md and docs/**/*.md runs, so the documentation cannot drift
from the code (tests/test_docs_paths.py checks the paths they name).

The SDK blocks talk to a real `gclm serve` of the embedded model (their base URL is pointed
at the test server); the transformers block loads the embedded model itself. One test per
block, named by its file and its number there (`docs/api/reasoning.md:1`).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_server import GclmServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DOCUMENTED_URL = "http://127.0.0.1:8000/v1"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


BLOCKS = {
    f"{page.relative_to(ROOT).as_posix()}:{number}": code
    for page in PAGES
    for number, code in enumerate(python_blocks(page), start=1)
}


def test_the_readme_and_the_docs_have_python_blocks() -> None:
    assert python_blocks(ROOT / "README.md"), "the README shows the SDK at work"
    assert len(BLOCKS) >= 4, sorted(BLOCKS)


THINK_TEMPLATE = Path(__file__).parent / "templates" / "think.jinja"


@pytest.fixture(scope="module")
def thinking_server() -> Iterator[GclmServer]:
    """The server the reasoning block documents: the embedded model made to think."""
    args = ("--reasoning-parser", "deepseek_r1", "--chat-template", str(THINK_TEMPLATE))
    with GclmServer(max_batch=2, extra_args=(*args, "--compile-timeout", "120")) as server:
        yield server


@pytest.mark.e2e
@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_documented_block_runs(block: str, request: pytest.FixtureRequest) -> None:
    thinks = "reasoning_effort" in BLOCKS[block]
    server = request.getfixturevalue("thinking_server" if thinks else "gclm_server")
    code = BLOCKS[block].replace(DOCUMENTED_URL, f"{server.url}/v1")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"{block} (python block)", "exec"), {})  # noqa: S102
    lines = printed.getvalue().splitlines()
    assert lines, "each documented block shows its result with print()"
    if thinks:  # the parsed Person, that it thought, and its thinking tokens
        assert re.fullmatch(r"""name=(['"]).*\1 age=-?\d+""", lines[0]), lines
        assert lines[1] == "True" and int(lines[2]) >= 3, lines  # the end marker: 3 tokens
    elif "chat.completions.parse" in code:  # the parsed Person, then its finish reason
        # repr() quotes a name holding a single quote with double quotes.
        assert re.fullmatch(r"""name=(['"]).*\1 age=-?\d+""", lines[0]), lines
        assert lines[1] == "stop"
    elif "create_constraint" in code:  # the generated JSON, valid against the schema
        person = json.loads(lines[-1])
        assert set(person) == {"name", "age"} and isinstance(person["age"], int), lines
