"""gclm's logits processor inside vLLM's own OpenAI server (no gclm server in between).

    GCLM_VLLM_TOKENIZER=M python -m vllm.entrypoints.openai.api_server --model M \\
        --logits-processors gclm.server.engine.vllm_processor:GclmLogitsProcessor

The official `openai` SDK sends the constraint in `vllm_xargs`. Every constrained output
must be valid and within budget at every budget from the minimum (read from the 400) to
the minimum + 5, on several schemas, regexes and choices, sampled at T=0.7.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from vllm_server import MODEL, min_tokens_from_400, xargs

from bench._vllm import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]

STR = {"type": "string"}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 20},
        "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
        "rating": {"type": "number", "minimum": 0, "maximum": 5},
        "genre": {"enum": ["novel", "poetry", "essay"]},
        "in_print": {"type": "boolean"},
    },
    "required": ["title", "year", "rating", "genre", "in_print"],
}
PLACE = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Lima", "Oslo"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["city", "tags"],
}
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
ANSWER = r"(yes|no), [a-z]{1,8}\."
COLORS = ["red", "green", "blue"]
PHRASES = ["The quick brown fox jumps", "no"]

CASES: list[tuple[str, dict[str, Any]]] = [
    ("person", {"json": PERSON}),
    ("book", {"json": BOOK}),
    ("place", {"json": PLACE}),
    ("date", {"regex": DATE}),
    ("answer", {"regex": ANSWER}),
    ("colors", {"choice": COLORS}),
    ("phrases", {"choice": PHRASES}),
]


def check(constraint: dict[str, Any], text: str) -> None:
    if "json" in constraint:
        jsonschema.Draft202012Validator(constraint["json"]).validate(json.loads(text))
    elif "regex" in constraint:
        assert re.fullmatch(constraint["regex"], text), text
    else:
        assert text in constraint["choice"], text


@pytest.fixture(scope="module")
def client(vllm_server: VllmServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{vllm_server.url}/v1", api_key="x", timeout=300.0, max_retries=0
    ) as client:
        yield client


def ask(client: openai.OpenAI, constraint: dict[str, Any], max_tokens: int, **kw: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer in the requested format."}],
        max_tokens=max_tokens,
        extra_body=xargs(constraint),
        **kw,
    )


def minimum(client: openai.OpenAI, constraint: dict[str, Any]) -> int:
    """The constraint's minimum budget: 1 when max_tokens=1 is accepted (and then its
    answer must be valid), else the one the 400 names."""
    try:
        reply = ask(client, constraint, 1, temperature=0)
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert "max_tokens=1 is too small for this constraint" in e.message
        return min_tokens_from_400(e)
    check(constraint, reply.choices[0].message.content)
    return 1


def test_first_constrained_request_after_start_gets_its_answer(vllm_server: VllmServer) -> None:
    """A fresh vLLM's first constrained request is answered (its table, or the budget's 400),
    not refused "compiler busy" while gclm's compile workers start (a fresh clone's
    `make test` failed so three times in three). The session's server, before any other
    test's request (this test comes first): one vLLM start less."""
    served = re.compile(r'"POST /v1/\S+ HTTP')  # vLLM's access log, one line a request
    log = vllm_server.log_path
    assert not served.search(log.read_text(errors="replace")), "not the server's first request"
    with openai.OpenAI(
        base_url=f"{vllm_server.url}/v1", api_key="x", timeout=600.0, max_retries=0
    ) as client:
        try:
            reply = ask(client, {"json": PERSON}, 40, temperature=0)
        except openai.APIError as e:
            raise AssertionError(f"{e}\nvLLM's log:\n{vllm_server.log_tail(80)}") from e
        check({"json": PERSON}, reply.choices[0].message.content)
        with pytest.raises(openai.BadRequestError) as refused:
            ask(client, {"json": BOOK}, 1, temperature=0)
    assert "max_tokens=1 is too small for this constraint" in refused.value.message
    assert len(served.findall(log.read_text(errors="replace"))) == 2


def test_valid_within_budget_min_to_min_plus_5(client: openai.OpenAI) -> None:
    """7 constraints x 6 budgets, 16 requests at a time, T=0.7: all valid, none over."""
    jobs = [
        (name, constraint, low + extra, seed)
        for seed, (name, constraint) in enumerate(CASES)
        for low in [minimum(client, constraint)]
        for extra in range(6)
    ]

    def run(job: tuple[str, dict[str, Any], int, int]) -> tuple[str, int, Any]:
        name, constraint, budget, seed = job
        reply = ask(client, constraint, budget, temperature=0.7, seed=seed * 100 + budget)
        return name, budget, reply

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, jobs))
    assert len(results) == len(CASES) * 6
    for (_, constraint, _, _), (name, budget, reply) in zip(jobs, results, strict=True):
        choice = reply.choices[0]
        assert reply.usage.completion_tokens <= budget, (name, budget)
        # vLLM itself says "length" for a complete output that used the whole budget.
        assert choice.finish_reason in ("stop", "length"), (name, budget)
        check(constraint, choice.message.content)


def test_budget_too_small_is_400_naming_minimum(client: openai.OpenAI) -> None:
    low = minimum(client, {"json": PERSON})
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, {"json": PERSON}, low - 1)
    assert f"Set max_tokens to at least {low}." in caught.value.message
    reply = ask(client, {"json": PERSON}, low, temperature=0)
    check({"json": PERSON}, reply.choices[0].message.content)


def test_n_samples_and_stream(client: openai.OpenAI) -> None:
    reply = ask(client, {"json": PERSON}, 30, n=3, temperature=0.9, seed=7)
    assert len(reply.choices) == 3
    for choice in reply.choices:
        check({"json": PERSON}, choice.message.content)
    stream = ask(client, {"regex": DATE}, 12, temperature=0.7, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check({"regex": DATE}, text)


def test_unconstrained_requests_share_the_batch(client: openai.OpenAI) -> None:
    def run(i: int) -> Any:
        if i % 2:
            return ask(client, {"choice": COLORS}, 4, temperature=0.7)
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6
        )

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(run, range(8)))
    for i, reply in enumerate(replies):
        if i % 2:
            assert reply.choices[0].message.content in COLORS
        else:
            assert reply.usage.completion_tokens <= 6


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"vllm_xargs": {"gclm": "{not json"}}, "JSON"),
        ({"vllm_xargs": {"gclm": json.dumps({"regex": "a", "choice": ["b"]})}}, "exactly one"),
        ({"vllm_xargs": {"gclm": json.dumps({"json": {"type": "strnig"}})}}, "strnig"),
        ({"vllm_xargs": {"gclm": json.dumps({"regex": "x"})}, "stop": ["x"]}, "stop"),
        ({"vllm_xargs": {"gclm": json.dumps({"regex": "x"})}, "min_tokens": 2}, "min_tokens"),
    ],
)
def test_bad_requests_are_400(client: openai.OpenAI, extra: dict[str, Any], named: str) -> None:
    body = dict(extra)
    stop = body.pop("stop", None)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=8,
            stop=stop,
            extra_body=body,
        )
    assert caught.value.status_code == 400
    assert named in caught.value.message
