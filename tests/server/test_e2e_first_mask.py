"""End to end: a new schema whose whole compile takes seconds is answered on first masks
(docs/first-mask.md), against a real `gclm serve` with the embedded model, through the SDK,
on a byte DFA grown from the regex's NFA in the server's process (no compile at all).

Two strings of up to 300 characters make a DFA of thousands of states: the compile worker's
token walk over the 49k vocabulary takes seconds, its byte DFA milliseconds.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from e2e_server import GclmServer

pytestmark = pytest.mark.e2e

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 300},
        "summary": {"type": "string", "maxLength": 300},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["title", "summary", "stars"],
    "additionalProperties": False,
}


def metric(server: GclmServer, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} is on /metrics"
    return float(found.group(1))


def first_mask_requests(server: GclmServer) -> float:
    return metric(server, "gclm_first_mask_requests_total")


def test_a_slow_new_schema_starts_on_first_masks(
    gclm_server: GclmServer, client: openai.OpenAI
) -> None:
    before = first_mask_requests(gclm_server)
    started = metric(gclm_server, "gclm_compiles_started_total")
    grown = metric(gclm_server, "gclm_first_masks_grown_total")
    for seed in (1, 2):  # the second finds the LazyTable cached
        done = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "Review a film in JSON."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "R", "schema": SCHEMA},
            },
            max_tokens=80,
            temperature=0.7,
            seed=seed,
        )
        choice = done.choices[0]
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
        assert choice.finish_reason == "stop"
        assert done.usage is not None and done.usage.completion_tokens <= 80
    assert first_mask_requests(gclm_server) == before + 2
    # No compile: the byte DFA grown here, and no request needed the whole table's walk.
    assert metric(gclm_server, "gclm_compiles_started_total") == started
    assert metric(gclm_server, "gclm_first_masks_grown_total") == grown + 1
