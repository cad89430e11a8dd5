"""Error bodies stay short and say gclm's words: an echoed value is cut to a prefix, and an
error from a dependency (outlines-core, Python's regex parser, serde_json) is mapped to gclm's
own message and code, never its exception text. The compiler here is the real one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fake_engine import FakeEngine
from harness import http_client

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.worker import _flatten as flatten
from gclm.compiler.service.worker import rebuild_error
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import MESSAGE_LIMIT, GclmError, InvalidRequestError
from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

BIG = "z" * (1 << 20)
BODY_LIMIT = 4096
DEPENDENCY_TEXT = (
    "OverflowError",
    "TypeError",
    "ValueError",
    "Failed to build DFA",
    "error building NFA",
    "Expected a valid JSON string",
    "repetition number",
    "Compilation failed",
)


def nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


class RealCompiler(FakeEngine):
    """The fake engine with gclm's own compiler (in a thread, as the pool's workers run it)."""

    def __init__(self, vocab: Any) -> None:
        super().__init__()
        self.vocab = vocab

    async def compile(
        self, constraint: Constraint, *, first_mask: bool = False, deadline: float | None = None
    ) -> CompiledTable:
        try:
            return await asyncio.to_thread(compile_constraint, constraint, self.vocab)
        except GclmError as e:  # sent back as a worker process sends it
            raise rebuild_error(*flatten(e)) from None


def schema_request(schema: Any) -> dict[str, Any]:
    return {
        "prompt": "x",
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }


def regex_request(pattern: str) -> dict[str, Any]:
    return {"prompt": "x", "structured_outputs": {"regex": pattern}}


CASES = {
    "repetition too large": (regex_request("a{4294967296}"), "invalid_constraint"),
    "number bound too large": (
        schema_request({"type": "number", "exclusiveMinimum": 1e308}),
        "compile_limit",
    ),
    "nested 95 deep": (schema_request(nested(95)), "schema_too_deep"),
    "huge unknown type": (schema_request({"type": BIG}), "invalid_constraint"),
    "huge missing $ref": (schema_request({"$ref": "#/$defs/" + BIG}), "invalid_constraint"),
    "huge invalid regex": (regex_request("(" + BIG), "invalid_constraint"),
    "huge pattern": (schema_request({"type": "string", "pattern": "(?=" + BIG}), None),
    "huge property name": (
        schema_request({"type": "object", "properties": {BIG: {"type": "strin"}}}),
        "invalid_constraint",
    ),
    "huge unknown parameter": ({"prompt": "x", BIG: 1}, "unknown_parameter"),
    "huge model name": ({"prompt": "x", "model": BIG}, "model_not_found"),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_errors_are_short_and_in_gclms_words(name: str, embedded_vocab, tmp_path) -> None:
    body, code = CASES[name]
    app = create_app(RealCompiler(embedded_vocab), ServerSettings(cache_dir=tmp_path))
    async with http_client(app) as http:
        response = await http.post("/v1/completions", json=body)
    assert response.status_code in (400, 404), response.text[:500]
    assert len(response.content) < BODY_LIMIT
    error = response.json()["error"]
    if code is not None:
        assert error["code"] == code
    assert not [t for t in DEPENDENCY_TEXT if t in error["message"]], error["message"]


def test_every_message_is_bounded_and_keeps_its_advice() -> None:
    message = InvalidRequestError(f"The value {BIG} is wrong. Fix it so.", param=None).message
    assert len(message) <= MESSAGE_LIMIT
    assert message.startswith("The value zzz") and message.endswith("Fix it so.")
