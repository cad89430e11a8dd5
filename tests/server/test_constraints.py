"""Constraints on both endpoints: where they come from, compile errors, and the budget check."""

from __future__ import annotations

import json
import re

import openai
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from harness import openai_client

from gclm.server.app import create_app
from gclm.server.openai.tools.prompt import OPENER
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
RF = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


async def chat(app: FastAPI, **kwargs):  # type: ignore[no-untyped-def]
    async with openai_client(app) as client:
        return await client.chat.completions.create(model="gclm-fake", messages=MESSAGES, **kwargs)


async def complete(app: FastAPI, **kwargs):  # type: ignore[no-untyped-def]
    async with openai_client(app) as client:
        return await client.completions.create(model="gclm-fake", prompt="Hi", **kwargs)


@pytest.mark.parametrize(
    ("extra", "kind", "spec"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", ""),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": SCHEMA},
                }
            },
            "json_schema",
            json.dumps(SCHEMA, separators=(",", ":")),  # key order kept
        ),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", None),
        ({"structured_outputs": {"regex": "[0-9]{3}"}}, "regex", "[0-9]{3}"),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", '["yes", "no"]'),
        ({"guided_regex": "x+"}, "regex", "x+"),
        ({"guided_choice": ["a", "b"]}, "choice", '["a", "b"]'),
        ({"guided_json": SCHEMA}, "json_schema", None),
    ],
)
async def test_constraint_sources(
    app: FastAPI, engine: FakeEngine, extra: dict, kind: str, spec: str | None
) -> None:
    await chat(app, extra_body=extra)
    await complete(app, extra_body=extra)
    assert [c.kind for c in engine.compiles] == [kind, kind]
    if spec is not None:
        assert engine.compiles[0].spec == spec
    tables = [r.constraint.table for r in engine.submits if r.constraint is not None]
    assert len(tables) == 2 and all(t is not None and t.min_tokens == 3 for t in tables)
    assert (engine.cache_misses, engine.cache_hits) == (1, 1)


@pytest.mark.parametrize(
    ("extra", "policy"),
    [
        ({"response_format": {"type": "json_object"}}, "graceful"),
        ({"structured_outputs": {"regex": "a+"}}, "graceful"),
        ({"structured_outputs": {"regex": "a+", "budget_policy": "graceful"}}, "graceful"),
        ({"structured_outputs": {"regex": "a+", "budget_policy": "none"}}, None),
        ({"structured_outputs": {"regex": "a+", "budget_aware": False}}, None),
        ({"guided_regex": "a+"}, "graceful"),
        ({}, None),  # free text: no constraint, no policy
    ],
)
async def test_budget_policy_defaults_to_graceful(
    app: FastAPI, engine: FakeEngine, extra: dict, policy: str | None
) -> None:
    await chat(app, extra_body=extra)
    [submitted] = engine.submits
    policy_given = submitted.constraint and submitted.constraint.policy
    assert (policy_given and policy_given.name) == policy


async def test_unknown_budget_policy_is_a_400(app: FastAPI, engine: FakeEngine) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(app, extra_body={"structured_outputs": {"regex": "a", "budget_policy": "x"}})
    assert caught.value.param == "structured_outputs.budget_policy"
    assert "'graceful' or 'none'" in caught.value.message
    assert engine.submits == []


async def test_budget_aware_can_be_switched_off(app: FastAPI, engine: FakeEngine) -> None:
    # Off, a budget below the minimum is allowed: the comparison mode shows what then breaks.
    extra = {"structured_outputs": {"regex": "a+", "budget_aware": False}}
    await chat(app, max_tokens=1, extra_body=extra)
    [submitted] = engine.submits
    assert submitted.constraint is not None and not submitted.constraint.budget_aware
    assert submitted.params.max_tokens == 1


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
async def test_budget_below_the_minimum_is_refused(
    app: FastAPI, engine: FakeEngine, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(app, response_format={"type": "json_object"}, **{param: 2})
    error = caught.value
    assert error.param == param
    assert error.code == "budget_too_small"
    assert f"Set {param} to at least 3" in error.message
    assert engine.submits == []


async def test_budget_on_the_completions_endpoint(app: FastAPI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await complete(app, max_tokens=1, extra_body={"guided_choice": ["x"]})
    assert caught.value.param == "max_tokens"
    assert "at least 3" in caught.value.message


async def test_invalid_schema_is_a_400_and_the_server_keeps_serving(app: FastAPI) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "frobnicate"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(app, response_format=bad)
    assert caught.value.param == "response_format"
    assert caught.value.code == "invalid_constraint"
    assert "'frobnicate' is not a JSON type" in caught.value.message
    completion = await chat(app)
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"guided_regex": "["}, "guided_regex"),
    ],
)
async def test_constraint_errors_name_their_source(
    app: FastAPI, engine: FakeEngine, extra: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await complete(app, extra_body=extra)
    assert caught.value.param == param
    assert engine.submits == []


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        (
            {
                "response_format": {"type": "json_object"},
                "extra_body": {"structured_outputs": {"regex": "a"}},
            },
            "structured_outputs",
        ),
        (
            {"extra_body": {"structured_outputs": {"regex": "a", "choice": ["a"]}}},
            "structured_outputs",
        ),
        ({"extra_body": {"structured_outputs": {"budget_aware": True}}}, "structured_outputs"),
        ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "guided_choice"),
        ({"max_tokens": 10, "max_completion_tokens": 20}, "max_completion_tokens"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a"}}},
            "response_format.json_schema.schema",
        ),
        (
            {"extra_body": {"structured_outputs": {"grammar": "root ::= x"}}},
            "structured_outputs.grammar",
        ),
    ],
)
async def test_conflicting_or_incomplete_constraints(
    app: FastAPI, engine: FakeEngine, kwargs: dict, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(app, **kwargs)
    assert caught.value.param == param
    assert engine.compiles == [] and engine.submits == []


@pytest.mark.parametrize(
    ("server", "extra", "expected"),
    [
        ("declared", {"structured_outputs": {"json": SCHEMA}}, "declared"),
        ("spec", {"structured_outputs": {"json": SCHEMA}}, "spec"),
        ("spec", {"response_format": RF}, "spec"),
        (
            "spec",
            {"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
            "declared",
        ),
        (
            "declared",
            {"structured_outputs": {"json": SCHEMA, "disable_additional_properties": False}},
            "spec",
        ),
    ],
)
async def test_additional_properties_from_the_server_or_the_request(
    engine: FakeEngine, tmp_path, server: str, extra: dict, expected: str
) -> None:
    app = create_app(engine, ServerSettings(cache_dir=tmp_path, additional_properties=server))
    await chat(app, extra_body=extra)
    assert [c.additional_properties for c in engine.compiles] == [expected]


async def test_disable_additional_properties_on_a_regex_is_a_400(app: FastAPI) -> None:
    so = {"regex": "a+", "disable_additional_properties": True}
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(app, extra_body={"structured_outputs": so})
    assert caught.value.body["param"] == "structured_outputs.disable_additional_properties"


@pytest.mark.parametrize("server", ["declared", "spec"])
async def test_tool_parameters_follow_the_server_rule(engine: FakeEngine, tmp_path, server) -> None:
    """A function whose parameters leave additionalProperties unsaid takes other keys in its
    arguments under --additional-properties spec, and only the declared ones by default."""
    app = create_app(engine, ServerSettings(cache_dir=tmp_path, additional_properties=server))
    tools = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]
    await chat(app, tools=tools, tool_choice="required")
    [constraint] = engine.compiles
    assert constraint.kind == "regex"

    def call(arguments: str) -> bool:
        text = OPENER + '[{"name": "f", "arguments": ' + arguments + "}]"
        return re.fullmatch(constraint.spec, text) is not None

    assert call('{"a": 1}')
    assert call('{"a": 1, "b": "x"}') is (server == "spec")
