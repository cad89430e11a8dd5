"""Every Python block in README.md runs, so the documented API cannot drift from the code.

The SDK blocks talk to a real `gclm serve` of the embedded model (their base URL is pointed
at the test server); the transformers block loads the embedded model itself.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from e2e_server import GclmServer

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
DOCUMENTED_URL = "http://127.0.0.1:8000/v1"


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index: int, gclm_server: GclmServer) -> None:
    code = BLOCKS[index].replace(DOCUMENTED_URL, f"{gclm_server.url}/v1")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"README.md python block {index + 1}", "exec"), {})  # noqa: S102
    lines = printed.getvalue().splitlines()
    assert lines, "each README block shows its result with print()"
    if "chat.completions.parse" in code:  # the parsed Person, then its finish reason
        # repr() quotes a name holding a single quote with double quotes.
        assert re.fullmatch(r"""name=(['"]).*\1 age=-?\d+""", lines[0]), lines
        assert lines[1] == "stop"
    elif "create_constraint" in code:  # the generated JSON, valid against the schema
        person = json.loads(lines[-1])
        assert set(person) == {"name", "age"} and isinstance(person["age"], int), lines
