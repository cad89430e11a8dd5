"""`gclm compile` as users run it: the console script, in a subprocess, on the embedded
tokenizer. Errors are one line on stderr and exit status 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

GCLM = Path(sys.executable).with_name("gclm")


def gclm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GCLM), *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_compile_regex_prints_one_json_object() -> None:
    done = gclm("compile", "--regex", "[0-9]{3}-[0-9]{4}", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert re.fullmatch("[0-9]{3}-[0-9]{4}", report["shortest_output"])
    assert 1 <= report["min_tokens"] <= 8
    assert report["states"] > 1 and report["table_bytes"] > 0


def test_compile_schema_and_choice(tmp_path: Path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(
        json.dumps(
            {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        )
    )
    done = gclm("compile", "--json-schema", str(schema))
    assert done.returncode == 0, done.stderr
    assert re.search(r"^shortest output '\{\"ok\": ?(true|false)\}'$", done.stdout, re.M)
    done = gclm("compile", "--choice", "yes", "--choice", "no", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["shortest_output"] in ("yes", "no")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--regex", "(unclosed"], "an unclosed '('"),
        (["--json-schema", "/nonexistent/schema.json"], "cannot read /nonexistent/schema.json"),
        (["--choice", ""], "An empty string is not a supported choice"),
    ],
)
def test_compile_errors_are_one_line(args: list[str], says: str) -> None:
    done = gclm("compile", *args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gclm: error: "), done.stderr
    assert says in lines[0]
