"""End to end on the embedded model: a tool loop chained by `previous_response_id` through the
openai SDK over 127.0.0.1, across a restart of `gclm serve` (killed, not shut down), with
constrained outputs valid on both sides of it; another API key gets 404s for those ids.

Two servers, one after the other, on one SQLite file (`--responses-db`) and one keys file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from e2e_server import GclmServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
ANSWER = {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 40}, "warm": {"type": "boolean"}},
    "required": ["summary", "warm"],
    "additionalProperties": False,
}
TEXT: Any = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, ...]]:
    keys = tmp_path / "keys"
    keys.write_text("sk-alice name=alice\nsk-bob name=bob\n")
    url = f"sqlite:///{tmp_path / 'responses.db'}"
    yield ("--responses-db", url, "--api-keys-file", str(keys))


def sdk(server: GclmServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, timeout=300.0, max_retries=0)


def test_a_tool_loop_chained_by_id_survives_a_restart(setup: tuple[str, ...]) -> None:
    with GclmServer(max_batch=2, extra_args=setup) as first:
        with sdk(first, "sk-alice") as alice:
            asked = alice.responses.create(
                model=MODEL,
                input="What is the weather in Paris?",
                tools=TOOLS,
                tool_choice="required",
                max_output_tokens=40,
            )
            [call] = asked.output
            assert call.type == "function_call"
            jsonschema.validate(json.loads(call.arguments), WEATHER)
            answered = alice.responses.create(
                model=MODEL,
                previous_response_id=asked.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
                tools=TOOLS,
                tool_choice="none",
                text=TEXT,
                max_output_tokens=60,
            )
            first_answer = json.loads(answered.output_text)
            jsonschema.validate(first_answer, ANSWER)
        # Killed: no shutdown, no checkpoint; what was committed must be there.
        assert first.process is not None
        first.process.kill()
        first.process.wait()

    with GclmServer(max_batch=2, extra_args=setup) as second:
        with sdk(second, "sk-alice") as alice, sdk(second, "sk-bob") as bob:
            kept = alice.responses.retrieve(answered.id)
            assert kept.output_text == answered.output_text
            assert kept.previous_response_id == asked.id
            again = alice.responses.create(
                model=MODEL,
                previous_response_id=answered.id,
                input="And tomorrow?",
                text=TEXT,
                max_output_tokens=60,
            )
            jsonschema.validate(json.loads(again.output_text), ANSWER)
            items = alice.responses.input_items.list(again.id, order="asc").data
            assert [item.type for item in items] == [
                "message",
                "function_call",
                "function_call_output",
                "message",
                "message",
            ]
            assert items[1].id == call.id and items[2].output == "21 C"  # type: ignore[union-attr]

            for response_id in (asked.id, answered.id, again.id):
                with pytest.raises(openai.NotFoundError):
                    bob.responses.retrieve(response_id)
                with pytest.raises(openai.NotFoundError):
                    bob.responses.create(model=MODEL, input="Hi", previous_response_id=response_id)
                with pytest.raises(openai.NotFoundError):
                    bob.responses.delete(response_id)

            alice.responses.delete(again.id)
            with pytest.raises(openai.NotFoundError):
                alice.responses.retrieve(again.id)
            assert alice.responses.retrieve(asked.id).output[0].id == call.id
        log = second.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
