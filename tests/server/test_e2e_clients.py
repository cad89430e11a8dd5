"""End to end: client libraries on the Responses API of a real server (embedded model).

LangChain's `ChatOpenAI(use_responses_api=True)` and pydantic-ai's `OpenAIResponsesModel`,
each asking for a JSON Schema output (LangChain's `with_structured_output(method=
"json_schema")`, pydantic-ai's `NativeOutput`: both send `text.format`), then each library's
tool path on the same API: LangChain's `method="function_calling"`, pydantic-ai's default
(tool) output, and the openai-agents SDK running a `function_tool`. (instructor's
`Mode.RESPONSES_TOOLS` is in test_e2e_instructor.py.)
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


# --- tools on the Responses API: each library's default tool path ---


def test_langchain_responses_api_function_calling(
    gclm_server: GclmServer, http: httpx.Client
) -> None:
    llm = chat_model(gclm_server, http, max_tokens=60)
    person = llm.with_structured_output(Person, method="function_calling").invoke(
        "Describe a person."
    )
    assert isinstance(person, Person)


def test_pydantic_ai_responses_model_tool_output(gclm_server: GclmServer) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async def run() -> Any:
        url = f"{gclm_server.url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
            model = OpenAIResponsesModel(MODEL, provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, output_type=Person)  # the default: a final_result tool
            result = await agent.run(
                "Describe a person.", model_settings={"max_tokens": 60, "temperature": 0}
            )
            return result.output

    assert isinstance(asyncio.run(run()), Person)


def test_openai_agents_function_tool(gclm_server: GclmServer) -> None:
    """The agents SDK's default model (Responses) runs a function_tool, then answers."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"Sunny and 21 C in {city}."

    async def run() -> Any:
        url = f"{gclm_server.url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
            agent = Agent(
                name="weather",
                instructions="Answer with the weather tool's result.",
                model=OpenAIResponsesModel(MODEL, openai_client=client),
                tools=[get_weather],
                model_settings=ModelSettings(tool_choice="required", max_tokens=40, temperature=0),
            )
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=3)

    result = asyncio.run(run())
    assert cities and all(isinstance(c, str) and c for c in cities)
    assert isinstance(result.final_output, str) and result.final_output
