"""End to end on the embedded model: the Responses API through the openai SDK, logprobs from
the masked distribution, and penalties and logit_bias under greedy decoding.

Shares the session's real server (tests/server/e2e_server.py) with test_e2e_sdk.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from pydantic import BaseModel, Field

from gclm.server.engine.model_loader import load_tokenizer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer()


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


# --- the Responses API ---


def test_create_free_text(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="Say hello.",
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0,
    )
    assert response.output_text
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and 1 <= response.usage.output_tokens <= 8
    assert response.usage.input_tokens > 0


def test_free_text_out_of_budget_is_incomplete(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="Write a long story about a dragon.",
        max_output_tokens=3,
        temperature=0,
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def min_output_tokens(client: openai.OpenAI, text_format: type[BaseModel]) -> int:
    """The schema's minimum budget, read from the 400 that max_output_tokens=1 earns."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.parse(
            model=MODEL, input="Who?", text_format=text_format, max_output_tokens=1
        )
    assert caught.value.param == "max_output_tokens"
    assert caught.value.code == "budget_too_small"
    found = re.search(r"Set max_output_tokens to at least (\d+)\.", caught.value.message)
    assert found, caught.value.message
    return int(found.group(1))


def test_parse_at_budgets_from_the_minimum_up(client: openai.OpenAI) -> None:
    least = min_output_tokens(client, Person)
    for budget in (least, least + 1, least + 4, 3 * least):
        response = client.responses.parse(
            model=MODEL,
            input="Describe a person called Ada as JSON.",
            text_format=Person,
            max_output_tokens=budget,
        )
        assert response.status == "completed", budget
        assert isinstance(response.output_parsed, Person), budget
        assert response.usage is not None and response.usage.output_tokens <= budget


def test_stream_with_text_format(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input="Describe a person as JSON.",
        text_format=Person,
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.status == "completed"
    assert Person.model_validate_json(deltas) == final.output_parsed


# --- logprobs ---


def test_logprobs_never_show_a_masked_token(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=chat("Pick a number."),
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}"}},
    )
    choice = reply.choices[0]
    assert re.fullmatch("[0-9]{3}", choice.message.content or "")
    content = choice.logprobs.content  # type: ignore[union-attr]
    assert content
    assert b"".join(bytes(t.bytes or []) for t in content) == choice.message.content.encode()
    for token in content:
        # Every candidate shown is one the regex allows at that point: digits only.
        assert token.top_logprobs
        assert all(re.fullmatch("[0-9]+", t.token) for t in token.top_logprobs), token
        # Fewer than 20 tokens are allowed, so the top list is the whole distribution.
        assert math.isclose(sum(math.exp(t.logprob) for t in token.top_logprobs), 1, abs_tol=1e-3)
        # Greedy: the chosen token is the most likely one.
        assert token.top_logprobs[0].token == token.token
        assert math.isclose(token.top_logprobs[0].logprob, token.logprob, abs_tol=1e-5)


def test_streamed_logprobs_cover_multibyte_text(client: openai.OpenAI) -> None:
    choices = ["café ☕", "thé 🍵"]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=chat("Coffee or tea?"),
        max_tokens=16,
        logprobs=True,
        stream=True,
        extra_body={"structured_outputs": {"choice": choices}},
    )
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text in choices
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert b"".join(bytes(t.bytes or []) for t in tokens) == text.encode()
    assert all(t.logprob <= 0 for t in tokens)


def test_completion_logprobs_shape(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=3
    )
    choice = reply.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert reply.usage is not None
    assert len(lp.tokens) in (reply.usage.completion_tokens, reply.usage.completion_tokens - 1)
    assert "".join(lp.tokens) == choice.text
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3
        assert top[token] == pytest.approx(value, abs=1e-5)  # greedy: the best one
        assert value == pytest.approx(max(top.values()), abs=1e-5)


def test_responses_logprobs(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=MODEL,
        input="Say hi.",
        max_output_tokens=5,
        temperature=0,
        top_logprobs=2,
        include=["message.output_text.logprobs"],
    )
    logprobs = response.output[0].content[0].logprobs
    assert logprobs
    assert "".join(t.token for t in logprobs) == response.output_text
    assert all(len(t.top_logprobs) == 2 for t in logprobs)


# --- penalties and logit_bias (greedy, so the direction is deterministic) ---

REPEAT = "Repeat the word 'apple' twenty times."


def most_repeated(text: str) -> int:
    return max(Counter(text.split()).values(), default=0)


def greedy(client: openai.OpenAI, content: str, **extra: Any) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=chat(content), max_tokens=32, temperature=0, **extra
    )
    return reply.choices[0].message.content or ""


def test_penalties_reduce_repeats(client: openai.OpenAI) -> None:
    base = greedy(client, REPEAT)
    assert most_repeated(base) >= 5, base  # the model does repeat without penalties
    for extra in (
        {"frequency_penalty": 2.0},
        {"presence_penalty": 2.0},
        {"extra_body": {"repetition_penalty": 1.8}},
    ):
        penalised = greedy(client, REPEAT, **extra)
        assert most_repeated(penalised) < most_repeated(base), (extra, penalised)


def test_negative_frequency_penalty_increases_repeats(client: openai.OpenAI) -> None:
    prompt = "Write one sentence about the sea."
    base = greedy(client, prompt)
    rewarded = greedy(client, prompt, frequency_penalty=-2.0)
    assert most_repeated(rewarded) > most_repeated(base), (base, rewarded)


def test_logit_bias_steers_free_text(client: openai.OpenAI, tokenizer: Any) -> None:
    [token] = tokenizer.encode(" banana", add_special_tokens=False)
    text = greedy(client, "Say something.", logit_bias={str(token): 100})
    assert text.count("banana") >= 10, text


def test_logit_bias_never_breaks_a_constraint(client: openai.OpenAI, tokenizer: Any) -> None:
    choices = ["yes", "no"]
    base = greedy(
        client, "Is the sky blue?", extra_body={"structured_outputs": {"choice": choices}}
    )
    other = next(c for c in choices if c != base)
    [other_token] = tokenizer.encode(other, add_special_tokens=False)
    [letter] = tokenizer.encode("a", add_special_tokens=False)
    steered = greedy(
        client,
        "Is the sky blue?",
        logit_bias={str(other_token): 30, str(letter): 100},
        extra_body={"structured_outputs": {"choice": choices}},
    )
    assert steered == other  # the bias moved the choice; "a" stayed masked
    digits = greedy(
        client,
        "Pick a number.",
        logit_bias={str(letter): 100},
        frequency_penalty=2.0,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}"}},
    )
    assert re.fullmatch("[0-9]{3}", digits)


def test_logit_bias_outside_the_vocabulary(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        greedy(client, "Hi", logit_bias={"99999999": 1})
    assert caught.value.param == "logit_bias"


def test_mixed_batch(client: openai.OpenAI) -> None:
    """Rows with and without penalties, bias and logprobs decode in one batch."""
    requests: list[dict[str, Any]] = [
        {"logprobs": True, "top_logprobs": 2, "frequency_penalty": 1.0},
        {},
        {"extra_body": {"repetition_penalty": 1.5, "structured_outputs": {"regex": "[a-z]{4}"}}},
        {"logprobs": True, "logit_bias": {"0": -5}},
    ]

    def run(extra: dict[str, Any]) -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=chat("Say a word."), max_tokens=6, temperature=0, **extra
        )

    with ThreadPoolExecutor(len(requests)) as pool:
        replies = list(pool.map(run, requests))
    for extra, reply in zip(requests, replies, strict=True):
        choice = reply.choices[0]
        assert choice.message.content
        assert (choice.logprobs is not None) == bool(extra.get("logprobs"))
        if choice.logprobs is not None:
            assert choice.logprobs.content
            width = extra.get("top_logprobs", 0)
            assert all(len(t.top_logprobs) == width for t in choice.logprobs.content)
    assert re.fullmatch("[a-z]{4}", replies[2].choices[0].message.content or "")
