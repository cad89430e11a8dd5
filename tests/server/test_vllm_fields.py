"""The request shapes vLLM clients send, through the openai SDK over the fake engine:
`guided_grammar` (Lark or GBNF) as `structured_outputs.grammar`, and `guided_decoding_backend`
/ `structured_outputs.backend`, accepted, ignored and named in a header."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from harness import openai_client

from gclm.server.openai.constraint_spec import BACKEND_HEADER
from gclm.server.openai.gbnf import to_lark

pytestmark = pytest.mark.anyio

MESSAGES: Any = [{"role": "user", "content": "Yes or no?"}]
LARK = 'start: "yes" | "no"\n'
GBNF = 'root ::= answer\nanswer ::= "yes" | "no" | [0-9]{1,2}'


async def both(app: FastAPI, extra: dict[str, Any]) -> None:
    async with openai_client(app) as client:
        await client.chat.completions.create(model="gclm-fake", messages=MESSAGES, extra_body=extra)
        await client.completions.create(model="gclm-fake", prompt="Hi", extra_body=extra)


@pytest.mark.parametrize(
    ("extra", "lark"),
    [
        ({"guided_grammar": LARK}, LARK),
        ({"guided_grammar": GBNF}, to_lark(GBNF)),
        ({"structured_outputs": {"grammar": GBNF}}, to_lark(GBNF)),
        ({"structured_outputs": {"grammar": LARK}}, LARK),
    ],
)
async def test_guided_grammar_is_structured_outputs_grammar(
    app: FastAPI, engine: FakeEngine, extra: dict[str, Any], lark: str
) -> None:
    await both(app, extra)
    assert [(c.kind, c.spec) for c in engine.compiles] == [("grammar", lark)] * 2
    assert all(r.constraint is not None for r in engine.submits)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_grammar": 'root ::= "a" (= "b")'}, "guided_grammar"),
        ({"structured_outputs": {"grammar": "root ::= [\\d]+"}}, "structured_outputs.grammar"),
        ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
        ({"guided_grammar": ""}, "guided_grammar"),
    ],
)
async def test_a_grammar_without_an_exact_translation_is_a_400(
    app: FastAPI, engine: FakeEngine, extra: dict[str, Any], param: str
) -> None:
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake", messages=MESSAGES, extra_body=extra
            )
    assert caught.value.param == param
    assert engine.submits == []


async def test_guided_grammar_with_another_constraint_is_a_conflict(app: FastAPI) -> None:
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gclm-fake",
                messages=MESSAGES,
                extra_body={"guided_regex": "a+", "guided_grammar": LARK},
            )
    assert caught.value.code == "conflicting_parameters"


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_json": {"type": "object"}, "guided_decoding_backend": "xgrammar"},
        {"structured_outputs": {"regex": "a+", "backend": "xgrammar"}},
        {"guided_decoding_backend": "xgrammar"},  # named without a constraint: still ignored
    ],
)
async def test_a_named_backend_is_ignored_and_said(
    app: FastAPI, engine: FakeEngine, extra: dict[str, Any]
) -> None:
    async with openai_client(app) as client:
        chat = await client.chat.completions.with_raw_response.create(
            model="gclm-fake", messages=MESSAGES, extra_body=extra
        )
        async with client.completions.with_streaming_response.create(
            model="gclm-fake", prompt="Hi", stream=True, extra_body=extra
        ) as streamed:
            async for _ in streamed.iter_lines():
                pass
    for headers in (chat.headers, streamed.headers):
        assert headers[BACKEND_HEADER] == "gclm (asked: xgrammar)"
    assert chat.parse().choices[0].finish_reason == "stop"


async def test_no_backend_no_header(app: FastAPI) -> None:
    async with openai_client(app) as client:
        chat = await client.chat.completions.with_raw_response.create(
            model="gclm-fake", messages=MESSAGES, extra_body={"guided_regex": "a+"}
        )
    assert BACKEND_HEADER not in chat.headers


async def test_a_backend_name_cannot_forge_a_header(app: FastAPI) -> None:
    async with openai_client(app) as client:
        chat = await client.chat.completions.with_raw_response.create(
            model="gclm-fake",
            messages=MESSAGES,
            extra_body={"guided_decoding_backend": "x\r\nset-cookie: a=b" + "y" * 100},
        )
    # Printable ASCII only, at most 40 characters of it.
    assert chat.headers[BACKEND_HEADER] == "gclm (asked: x??set-cookie: a=b" + "y" * 22 + ")"
    assert "set-cookie" not in chat.headers
