"""The OpenAPI document describes the real request bodies, and the app keeps to it:
schemathesis fuzzes the POST endpoints (and the rest) against the fake engine, with all
its checks."""

from __future__ import annotations

import re
import tempfile

import httpx
import schemathesis
from fake_engine import FakeEngine
from hypothesis import HealthCheck, settings
from schemathesis import checks

from gclm.server.app import create_app
from gclm.server.openai.chat.protocol import ChatCompletionRequest
from gclm.server.openai.completions.protocol import CompletionRequest
from gclm.server.openai.responses.protocol import ResponsesRequest
from gclm.server.settings import ServerSettings

# Stored responses in a directory of the test's own (the fuzzed turns are stored).
STORE = f"sqlite:///{tempfile.mkdtemp(prefix='gclm-openapi-')}/responses.db"
APP = create_app(FakeEngine(), ServerSettings(responses_db=STORE))
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)


def test_post_endpoints_document_their_request_bodies() -> None:
    doc = APP.openapi()
    components = doc["components"]["schemas"]
    for path, model in (
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/completions", CompletionRequest),
        ("/v1/responses", ResponsesRequest),
    ):
        operation = doc["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model.__name__}"}
        documented = components[model.__name__]
        assert set(documented["properties"]) == set(model.model_fields)
        assert documented["additionalProperties"] is False  # unknown fields are a 400
        assert {"200", "400", "413", "429"} <= set(operation["responses"])
        assert "422" not in operation["responses"]
    seed = components["ChatCompletionRequest"]["properties"]["seed"]["anyOf"][0]
    assert (seed["minimum"], seed["maximum"]) == (-(1 << 63), (1 << 63) - 1)


# The 400s a JSON Schema cannot rule out, by error code: why, and the params they may name.
# Any other refusal of a body the document calls valid fails the test.
CONSTRAINT_CONTENT = (
    r"(guided_json|guided_regex|guided_grammar|structured_outputs\.(json|regex|grammar)|"
    r"response_format\.json_schema\.schema|text\.format\.schema|"
    r"tools\[\d+\]\.(function\.)?parameters|tools\[\d+\]\.(custom\.)?format)([./\[].*)?"
)
INEXPRESSIBLE = {
    "budget_too_small": ("the fewest tokens the compiled constraint needs", ".*"),
    "context_length_exceeded": ("the prompt's length in tokens", ".*"),
    "too_many_choices": ("prompts x n against --queue-size (n alone is documented)", "n"),
    "duplicate_tool_name": ("tool names distinct (uniqueItems compares whole tools)", ".*"),
    "unknown_tool": ("tool_choice naming one of the tools", ".*"),
    "conflicting_parameters": (
        "max_tokens equal to max_completion_tokens",
        "max_completion_tokens",
    ),
    # Whether a schema or regex compiles, or a JSON-text schema parses: the constraint itself.
    "invalid_constraint": ("a constraint that does not compile", CONSTRAINT_CONTENT),
    "unsupported_schema": ("a schema keyword gclm cannot honour", CONSTRAINT_CONTENT),
    "compile_limit": ("a constraint too large to compile", CONSTRAINT_CONTENT),
}


def inexpressible(response) -> bool:
    """Whether a 400 is one of INEXPRESSIBLE (by code, and the param it names)."""
    if response.status_code != 400:
        return False
    error = response.json()["error"]
    if error["code"] not in INEXPRESSIBLE:
        return False
    _, params = INEXPRESSIBLE[error["code"]]
    return re.fullmatch(params, error["param"] or "") is not None


def test_only_the_named_refusals_are_inexpressible() -> None:
    def answer(code: str, param: str | None) -> httpx.Response:
        return httpx.Response(400, json={"error": {"code": code, "param": param}})

    assert inexpressible(answer("budget_too_small", "max_tokens"))
    assert inexpressible(answer("invalid_constraint", "structured_outputs.regex"))
    assert not inexpressible(answer("invalid_constraint", "guided_choice"))  # documented
    assert not inexpressible(answer("conflicting_parameters", "guided_json"))  # documented
    assert not inexpressible(answer("unsupported_parameter", "moderation"))
    assert not inexpressible(httpx.Response(429, json={"error": {"code": "budget_too_small"}}))


@SCHEMA.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_keeps_to_its_openapi_document(case) -> None:
    # All checks: no 5xx; every status, content type and body as documented; schema-violating
    # requests refused, and schema-valid ones accepted except for INEXPRESSIBLE refusals.
    response = case.call()
    excluded = [checks.positive_data_acceptance] if inexpressible(response) else []
    case.validate_response(response, excluded_checks=excluded)
