"""Stored responses over the fake engine, through the openai SDK: `store`,
`previous_response_id`, retrieve, input items, delete, isolation between API keys, a
restart, the limits, and concurrent writers on one database."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import openai
import pytest
from fake_engine import FREE_TEXT, FakeEngine
from harness import http_client, openai_client

from gclm.server.app import create_app
from gclm.server.openai.responses.store import ResponseStore
from gclm.server.openai.tools.prompt import OPENER
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

FREE = "".join(FREE_TEXT)
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
CALL_SCRIPT = (OPENER, '[{"name": "get_weather", "arguments": {"city": "Paris"}}]')


def server(tmp_path: Path, script: Any = None, **settings: Any) -> tuple[Any, FakeEngine]:
    engine = FakeEngine(script) if script is not None else FakeEngine()
    return create_app(engine, ServerSettings(cache_dir=tmp_path, **settings)), engine


async def test_a_response_is_stored_and_retrieved(tmp_path: Path) -> None:
    app, _ = server(tmp_path)
    async with openai_client(app) as client:
        created = await client.responses.create(model="gclm-fake", input="Hi")
        got = await client.responses.retrieve(created.id)
    assert created.model_extra is not None and created.model_extra["store"] is True
    assert got.id == created.id and got.status == "completed"
    assert got.output_text == FREE == created.output_text
    assert got.usage is not None and got.usage == created.usage
    assert (tmp_path / "responses.db").is_file()


async def test_a_chained_turn_reads_the_stored_conversation(tmp_path: Path) -> None:
    app, engine = server(tmp_path)
    async with openai_client(app) as client:
        first = await client.responses.create(
            model="gclm-fake", input="Hi", instructions="Be brief."
        )
        second = await client.responses.create(
            model="gclm-fake", input="And then?", previous_response_id=first.id
        )
        items = await client.responses.input_items.list(second.id, order="asc")
    # The earlier instructions are not carried over, as at OpenAI; the turns are.
    assert engine.chats[-1] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": FREE},
        {"role": "user", "content": "And then?"},
    ]
    assert second.previous_response_id == first.id
    assert [(i.type, getattr(i, "role", None)) for i in items.data] == [
        ("message", "user"),
        ("message", "assistant"),
        ("message", "user"),
    ]
    assert items.data[1].id == first.output[0].id  # the earlier output item, as it was sent
    assert items.data[2].content[0].text == "And then?"  # type: ignore[union-attr]


async def test_a_tool_loop_chained_by_id(tmp_path: Path) -> None:
    scripts = iter([CALL_SCRIPT, ("It is ", "sunny.")])
    app, engine = server(tmp_path, lambda request: next(scripts))
    async with openai_client(app) as client:
        first = await client.responses.create(
            model="gclm-fake", input="Weather in Paris?", tools=TOOLS, tool_choice="required"
        )
        [call] = first.output
        assert call.type == "function_call"
        second = await client.responses.create(
            model="gclm-fake",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=TOOLS,
        )
    assert second.output_text == "It is sunny."
    messages = engine.chats[-1]
    assert [m["role"] for m in messages[-3:]] == ["user", "assistant", "user"]
    assert messages[-3]["content"].endswith("Weather in Paris?")
    # gclm's fallback prompt writes the call as the assistant's text, the result as a user
    # <tool_response> (tools/prompt.py); both come from the stored conversation.
    assert '"get_weather"' in messages[-2]["content"] and "Paris" in messages[-2]["content"]
    assert "sunny" in messages[-1]["content"]


async def test_a_streamed_response_is_stored_before_it_completes(tmp_path: Path) -> None:
    app, engine = server(tmp_path)
    async with openai_client(app) as client:
        stream = await client.responses.create(model="gclm-fake", input="Hi", stream=True)
        completed = None
        async for event in stream:
            if event.type == "response.completed":
                completed = event.response
                # Stored before this event was sent: a client chains on it at once.
                got = await client.responses.retrieve(completed.id)
                assert got.output_text == FREE
        assert completed is not None
        await client.responses.create(
            model="gclm-fake", input="More", previous_response_id=completed.id
        )
    assert engine.chats[-1][1] == {"role": "assistant", "content": FREE}


async def test_a_response_under_way_is_not_readable(tmp_path: Path) -> None:
    app, _ = server(tmp_path)
    app.state.engine.token_delay = 0.2
    async with openai_client(app) as client, http_client(app) as http:
        stream = await client.responses.create(model="gclm-fake", input="Hi", stream=True)
        events = stream.__aiter__()
        created = await events.__anext__()
        assert created.type == "response.created"
        during = await http.get(f"/v1/responses/{created.response.id}")
        assert during.status_code == 404
        async for _ in events:
            pass
        after = await http.get(f"/v1/responses/{created.response.id}")
    assert after.status_code == 200 and after.json()["status"] == "completed"


async def test_store_false_stores_nothing(tmp_path: Path) -> None:
    app, _ = server(tmp_path)
    async with openai_client(app) as client:
        created = await client.responses.create(model="gclm-fake", input="Hi", store=False)
        with pytest.raises(openai.NotFoundError) as caught:
            await client.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(
                model="gclm-fake", input="Hi", previous_response_id=created.id
            )
    assert created.model_extra is not None and created.model_extra["store"] is False
    assert caught.value.body["message"]  # type: ignore[index] == f"No response found with id '{created.id}'."


async def test_delete(tmp_path: Path) -> None:
    app, _ = server(tmp_path)
    async with openai_client(app) as client, http_client(app) as http:
        created = await client.responses.create(model="gclm-fake", input="Hi")
        await client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)
        again = await http.delete(f"/v1/responses/{created.id}")
    assert again.status_code == 404
    assert again.json()["error"]["message"] == f"No response found with id '{created.id}'."


async def test_unknown_ids_are_404s_naming_the_parameter(tmp_path: Path) -> None:
    app, engine = server(tmp_path)
    async with http_client(app) as http:
        chained = await http.post(
            "/v1/responses", json={"input": "Hi", "previous_response_id": "resp_nope"}
        )
        items = await http.get("/v1/responses/resp_nope/input_items")
    assert chained.status_code == 404
    assert chained.json()["error"]["param"] == "previous_response_id"
    assert chained.json()["error"]["message"] == "No response found with id 'resp_nope'."
    assert items.status_code == 404
    assert engine.submits == []


def keys_file(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    keys.write_text("sk-alice name=alice\nsk-bob name=bob\n")
    return keys


async def test_a_key_never_reads_another_keys_responses(tmp_path: Path) -> None:
    app, engine = server(tmp_path, api_keys_file=keys_file(tmp_path))
    async with (
        openai_client(app, api_key="sk-alice") as alice,
        openai_client(app, api_key="sk-bob") as bob,
    ):
        created = await alice.responses.create(model="gclm-fake", input="secret")
        for attempt in (
            bob.responses.retrieve(created.id),
            bob.responses.input_items.list(created.id),
            bob.responses.delete(created.id),
            bob.responses.create(model="gclm-fake", input="x", previous_response_id=created.id),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await attempt
            assert caught.value.body["message"]  # type: ignore[index] == f"No response found with id '{created.id}'."
        assert (await alice.responses.retrieve(created.id)).output_text == FREE
    assert len(engine.submits) == 1
    # The key itself is never stored: rows name a digest of it.
    with sqlite3.connect(tmp_path / "responses.db") as db:
        owners = {row[0] for row in db.execute("SELECT owner FROM responses")}
    assert len(owners) == 1 and "sk-alice" not in next(iter(owners))


async def test_a_restart_loses_nothing(tmp_path: Path) -> None:
    app, _ = server(tmp_path)
    async with openai_client(app) as client:
        created = await client.responses.create(model="gclm-fake", input="Hi")
    app.state.responses.close()
    restarted, engine = server(tmp_path)
    async with openai_client(restarted) as client:
        got = await client.responses.retrieve(created.id)
        await client.responses.create(
            model="gclm-fake", input="Again", previous_response_id=created.id
        )
    assert got.output_text == FREE
    assert engine.chats[-1][:2] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": FREE},
    ]


async def test_a_response_past_its_retention_is_gone(tmp_path: Path) -> None:
    app, _ = server(tmp_path, responses_retention=1e-9)  # under a millisecond
    async with openai_client(app) as client:
        created = await client.responses.create(model="gclm-fake", input="Hi")
        await asyncio.sleep(0.01)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)


async def test_a_conversation_past_the_size_limit_is_a_400(tmp_path: Path) -> None:
    app, engine = server(tmp_path, responses_max_size=1)
    half = "x" * 600_000
    async with openai_client(app) as client:
        with pytest.raises(openai.BadRequestError) as alone:
            await client.responses.create(model="gclm-fake", input="x" * 1_200_000)
        first = await client.responses.create(model="gclm-fake", input=half)
        with pytest.raises(openai.BadRequestError) as chained:
            await client.responses.create(
                model="gclm-fake", input=half, previous_response_id=first.id
            )
        # Not stored, the same turn is served: the limit is on what is kept.
        await client.responses.create(model="gclm-fake", input=half, store=False)
    assert (alone.value.param, alone.value.code) == ("input", "conversation_too_large")
    assert (chained.value.param, chained.value.code) == (
        "previous_response_id",
        "conversation_too_large",
    )
    assert "--responses-max-size" in chained.value.message
    assert len(engine.submits) == 2


async def test_with_the_store_off(tmp_path: Path) -> None:
    app, _ = server(tmp_path, responses_db="off")
    async with openai_client(app) as client, http_client(app) as http:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(model="gclm-fake", input="Hi", store=True)
        # Unset, store is true at OpenAI; a server that stores none serves it unstored.
        created = await client.responses.create(model="gclm-fake", input="Hi")
        got = await http.get(f"/v1/responses/{created.id}")
        with pytest.raises(openai.BadRequestError) as chained:
            await client.responses.create(
                model="gclm-fake", input="Hi", previous_response_id=created.id
            )
    assert caught.value.param == "store"
    assert created.model_extra is not None and created.model_extra["store"] is False
    assert got.status_code == 400
    assert "--responses-db off" in chained.value.message
    assert not (tmp_path / "responses.db").exists()


async def test_concurrent_writers_on_one_database(tmp_path: Path) -> None:
    """Two servers on one SQLite file (as behind a balancer), 20 turns at once: every one is
    stored and readable from either."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    first, _ = server(tmp_path / "a", responses_db=url)
    second, _ = server(tmp_path / "b", responses_db=url)
    async with openai_client(first) as a, openai_client(second) as b:
        created = await asyncio.gather(
            *(
                (a if i % 2 else b).responses.create(model="gclm-fake", input=f"turn {i}")
                for i in range(20)
            )
        )
        for response in created:
            for client in (a, b):
                assert (await client.responses.retrieve(response.id)).output_text == FREE
    assert not (tmp_path / "a" / "responses.db").exists()


def test_a_store_opens_while_another_holds_the_files_write_lock(tmp_path: Path) -> None:
    """Another server mid-write while the file is still in the rollback journal: switching it
    to WAL makes SQLite answer "database is locked" at once, not after its busy timeout; the
    store waits for the writer instead (this failed one run in ten with two servers)."""
    path = tmp_path / "r.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE other (a)")
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, other.execute, ("COMMIT",))
    release.start()
    store = ResponseStore(path, retention_s=60.0, max_bytes=1 << 20)
    store.put("", {"id": "resp_a"}, [])
    release.join()
    assert store.get("", "resp_a") is not None
    with sqlite3.connect(path) as fresh:
        assert fresh.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other.close()


def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    """A write that fails after its row is inserted (here: at COMMIT) is rolled back whole,
    and the database goes on."""
    store = ResponseStore(tmp_path / "r.db", retention_s=60.0, max_bytes=1 << 20)
    store.put("", {"id": "resp_kept"}, [])
    db = store._db()

    class FailingCommit:
        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return db.execute(sql, *args)

    store._local.db = FailingCommit()
    with pytest.raises(sqlite3.OperationalError):
        store.put("", {"id": "resp_lost"}, [{"type": "message"}])
    store._local.db = db
    assert store.get("", "resp_lost") is None
    assert store.get("", "resp_kept") is not None
    store.put("", {"id": "resp_after"}, [])
    assert store.get("", "resp_after") is not None
    with sqlite3.connect(tmp_path / "r.db") as other:  # another process's view
        ids = sorted(row[0] for row in other.execute("SELECT id FROM responses"))
    assert ids == ["resp_after", "resp_kept"]


@pytest.mark.parametrize(
    "url", ["postgresql://db/gclm", "sqlite://relative", "mysql:///x", "sqlite:///"]
)
def test_a_database_url_other_than_sqlite_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="SQLite only"):
        ServerSettings(responses_db=url)


def test_a_sqlite_url_names_its_file(tmp_path: Path) -> None:
    settings = ServerSettings(cache_dir=tmp_path, responses_db=f"sqlite:///{tmp_path}/x/r.db")
    store = ResponseStore.open(settings)
    assert store is not None and store.path == tmp_path / "x" / "r.db"


async def test_an_openai_agents_loop_chained_by_id(tmp_path: Path) -> None:
    """The agents SDK runs a function tool with auto_previous_response_id: each turn after
    the first sends only its new items and the id of the one before; a next run chains on
    the last response's id."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    scripts = iter([CALL_SCRIPT, ("Sunny in ", "Paris."), ("Still ", "sunny.")])
    app, engine = server(tmp_path, lambda request: next(scripts))
    sent: list[dict[str, Any]] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    async with openai_client(app) as client:
        client._client.event_hooks["request"].append(
            lambda request: _record(sent, request)  # type: ignore[arg-type]
        )
        agent = Agent(
            name="weather",
            model=OpenAIResponsesModel("gclm-fake", openai_client=client),
            tools=[get_weather],
        )
        first = await Runner.run(agent, "Weather in Paris?", auto_previous_response_id=True)
        second = await Runner.run(agent, "And now?", previous_response_id=first.last_response_id)
    assert first.final_output == "Sunny in Paris."
    assert second.final_output == "Still sunny."
    assert [body.get("previous_response_id") is not None for body in sent] == [False, True, True]
    assert [item["type"] for item in sent[1]["input"]] == ["function_call_output"]
    # The last prompt holds every turn, read back from the database.
    last = [(m["role"], m["content"]) for m in engine.chats[-1]][1:]  # after the tools block
    assert last[0] == ("user", "Weather in Paris?")
    assert last[1][0] == "assistant" and '"get_weather"' in last[1][1]
    assert last[2][0] == "user" and "sunny in Paris" in last[2][1]  # the tool's result
    assert last[3:] == [("assistant", "Sunny in Paris."), ("user", "And now?")]


async def _record(sent: list[dict[str, Any]], request: Any) -> None:
    if request.method == "POST" and request.url.path.endswith("/responses"):
        sent.append(json.loads(request.content))


async def test_a_405_lists_every_method_of_the_path(tmp_path: Path) -> None:
    app, _ = server(tmp_path)
    async with http_client(app) as http:
        response = await http.put("/v1/responses/resp_1")
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, GET"


async def test_a_database_that_cannot_open_is_a_503(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    app, engine = server(tmp_path, responses_db=f"sqlite:///{tmp_path / 'file' / 'r.db'}")
    async with openai_client(app) as client:
        with pytest.raises(openai.InternalServerError) as caught:
            await client.responses.create(model="gclm-fake", input="Hi")
        # Storing is the last step: the answer is lost with it, but store false is served.
        await client.responses.create(model="gclm-fake", input="Hi", store=False)
    assert caught.value.status_code == 503
    assert "stored responses' database failed" in caught.value.message


async def test_reasoning_items_are_kept_and_left_out_of_the_next_prompt(tmp_path: Path) -> None:
    """A reasoning model's reasoning item is stored with its turn and listed among the next
    turn's input items; the next prompt leaves it out, as chat templates leave out an
    earlier turn's thinking."""
    from fake_engine import Thought

    from gclm.server.openai.reasoning import ReasoningParser

    parser = ReasoningParser("deepseek_r1", "<think>", "</think>", (7, 8, 9))
    engine = FakeEngine(lambda request: [Thought("<think>hm"), Thought(", yes"), "Yes."])
    app = create_app(engine, ServerSettings(cache_dir=tmp_path), reasoning=parser)
    async with openai_client(app) as client:
        first = await client.responses.create(model="gclm-fake", input="Sure?")
        second = await client.responses.create(
            model="gclm-fake", input="Really?", previous_response_id=first.id
        )
        items = await client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in first.output] == ["reasoning", "message"]
    assert [item.type for item in items.data] == ["message", "reasoning", "message", "message"]
    assert items.data[1].id == first.output[0].id
    assert items.data[1].content[0].text == "hm, yes"  # type: ignore[union-attr, index]
    assert engine.chats[-1] == [
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "Really?"},
    ]
