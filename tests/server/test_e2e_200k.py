"""End to end at 200k tokens: a real `gclm serve --model DIR` over bench/o200k.py's model
directory (o200k_base's tokenizer, a one-layer random Llama), through the SDK.

The weights are random, so every valid output is the masks' doing. New schemas start on
first masks from a byte DFA grown from their NFA in the server (docs/first-mask.md), with no
compile; a tight budget waits for the whole table and still ends complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from bench._server import GclmServer

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "score": {"type": "number"},
            "ok": {"type": "boolean"},
        },
        "required": ["tags", "ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["日本", "émoji 🎉", "x"]}, "minItems": 1, "maxItems": 4},
]


@pytest.fixture(scope="module")
def o200k_server() -> Iterator[GclmServer]:
    pytest.importorskip("bpe_openai", reason="pip install bpe-openai==0.1.4 tiktoken (dev)")
    pytest.importorskip("tiktoken", reason="pip install tiktoken (dev)")
    from bench.o200k import build

    model: Path = build()
    with GclmServer(max_batch=4, extra_args=("--model", str(model))) as server:
        yield server
        log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, f"the server logged an exception:\n{log[-4000:]}"


def metric(server: GclmServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} is on /metrics"
    return float(found.group(1))


def test_new_schemas_at_200k_start_on_their_byte_dfa_and_end_valid(o200k_server) -> None:
    started = metric(o200k_server, "gclm_compiles_started_total")
    grown = metric(o200k_server, "gclm_first_masks_grown_total")
    with openai.OpenAI(base_url=f"{o200k_server.url}/v1", api_key="x", max_retries=0) as client:
        model = client.models.list().data[0].id
        for i, schema in enumerate(SCHEMAS):
            done = client.completions.create(
                model=model,
                prompt="JSON:",
                max_tokens=200,
                temperature=1.0,
                seed=i,
                extra_body={"guided_json": schema},
            )
            choice = done.choices[0]
            jsonschema.validate(json.loads(choice.text), schema)
            assert choice.finish_reason == "stop"
        # No request needed a whole table: no compile, each byte DFA grown here.
        assert metric(o200k_server, "gclm_compiles_started_total") == started
        assert metric(o200k_server, "gclm_first_masks_grown_total") == grown + len(SCHEMAS)
        # Below the minimum: a 400 naming it, from the LazyTable's exact search.
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(
                model=model, prompt="JSON:", max_tokens=3, extra_body={"guided_json": SCHEMAS[0]}
            )
        needs = re.search(r"needs (\d+) tokens", caught.value.message)
        assert needs, caught.value.message
        minimum = int(needs.group(1))
        # A tight budget waits for the whole table (graceful closure plans over it) and
        # still ends complete, within it.
        tight = client.completions.create(
            model=model,
            prompt="JSON:",
            max_tokens=minimum + 2,
            temperature=1.0,
            seed=7,
            extra_body={"guided_json": SCHEMAS[0]},
        )
        jsonschema.validate(json.loads(tight.choices[0].text), SCHEMAS[0])
        assert tight.usage is not None and tight.usage.completion_tokens <= minimum + 2
    assert metric(o200k_server, "gclm_compiles_started_total") == started + 1  # the tight one
