"""End to end: instructor on a real server (embedded model), in the modes users pick.

`Mode.RESPONSES_TOOLS` sends `text.format` (the model's JSON Schema) together with `tools`
and a named `tool_choice` on /v1/responses; gclm reads the call as the answer and the format
as the form of a text answer (also streamed, by `create_partial`). `Mode.TOOLS`, `JSON_SCHEMA`
and `JSON` are the chat completions paths (a named tool; `response_format` json_schema /
json_object). instructor is installed without its dependency pins (see the Makefile), and
retries are off: every answer is gclm's first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from e2e_server import GclmServer
from pydantic import BaseModel, Field

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


@pytest.fixture
def sdk(gclm_server: GclmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{gclm_server.url}/v1", api_key="x", timeout=300.0, max_retries=0
    ) as client:
        yield client


def patched(sdk: openai.OpenAI, mode: str) -> Any:
    """instructor on `sdk` in Mode.<mode> (imported here, as the other client libraries
    are: collecting the e2e files must not need them)."""
    import instructor

    return instructor.from_openai(sdk, mode=instructor.Mode[mode])


def test_responses_tools(sdk: openai.OpenAI) -> None:
    client = patched(sdk, "RESPONSES_TOOLS")
    person = client.responses.create(
        model=MODEL,
        input="Describe a person.",
        response_model=Person,
        max_output_tokens=60,
        temperature=0,
        max_retries=0,
    )
    assert isinstance(person, Person)
    Person.model_validate(person.model_dump())  # every constraint of the schema holds


def test_responses_tools_streamed(sdk: openai.OpenAI) -> None:
    """create_partial reads the streamed response.function_call_arguments.delta events."""
    client = patched(sdk, "RESPONSES_TOOLS")
    partials = list(
        client.responses.create_partial(
            model=MODEL,
            input="Describe a person.",
            response_model=Person,
            max_output_tokens=60,
            temperature=0,
            max_retries=0,
        )
    )
    assert len(partials) > 2  # the arguments arrive in pieces
    Person.model_validate(partials[-1].model_dump())


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA", "JSON"])
def test_chat_completions(sdk: openai.OpenAI, mode: str) -> None:
    client = patched(sdk, mode)
    person = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person."}],
        response_model=Person,
        max_tokens=60,
        temperature=0,
        max_retries=0,
    )
    assert isinstance(person, Person)
    Person.model_validate(person.model_dump())


def test_auto_tools_with_text_format_compile_on_the_real_vocabulary(sdk: openai.OpenAI) -> None:
    """Under "auto" the answer is a call or JSON in the format, never free text."""
    schema = Person.model_json_schema()
    tools: Any = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        }
    ]
    for prompt in ("Describe a person.", "What is the weather in Paris?"):
        response = sdk.responses.create(
            model=MODEL,
            input=prompt,
            tools=tools,
            text={"format": {"type": "json_schema", "name": "Person", "schema": schema}},
            max_output_tokens=60,
            temperature=0,
        )
        assert response.status == "completed"
        [item] = response.output
        if item.type == "function_call":
            assert item.name == "get_weather" and json.loads(item.arguments)["city"]
        else:
            Person.model_validate_json(response.output_text)
