"""End to end: client libraries on the Responses API of a real server (embedded model).

LangChain's `ChatOpenAI(use_responses_api=True)` and pydantic-ai's `OpenAIResponsesModel`,
each asking for a JSON Schema output (LangChain's `with_structured_output(method=
"json_schema")`, pydantic-ai's `NativeOutput`: both send `text.format`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
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
def http() -> Iterator[httpx.Client]:
    """The libraries' own HTTP clients are never closed; warnings are errors here."""
    with httpx.Client(timeout=300.0) as client:
        yield client


def chat_model(server: GclmServer, http: httpx.Client, max_tokens: int) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL,
        base_url=f"{server.url}/v1",
        api_key="x",
        use_responses_api=True,
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
        http_client=http,
    )


def test_langchain_responses_api_json_schema(gclm_server: GclmServer, http: httpx.Client) -> None:
    llm = chat_model(gclm_server, http, max_tokens=40)
    person = llm.with_structured_output(Person, method="json_schema").invoke(
        "Describe a person as JSON."
    )
    assert isinstance(person, Person)
    reply = llm.invoke("Say hi.")
    assert reply.text


def test_langchain_responses_api_streams(gclm_server: GclmServer, http: httpx.Client) -> None:
    llm = chat_model(gclm_server, http, max_tokens=8)
    pieces = [chunk.text for chunk in llm.stream("Say hi.")]
    assert "".join(pieces)


def test_pydantic_ai_responses_model_native_output(gclm_server: GclmServer) -> None:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def run() -> Any:
        url = f"{gclm_server.url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
            model = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, output_type=NativeOutput(Person))
            result = await agent.run(
                "Describe a person as JSON.", model_settings={"max_tokens": 40, "temperature": 0}
            )
            return result.output

    assert isinstance(asyncio.run(run()), Person)
