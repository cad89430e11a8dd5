"""Fixtures for the HTTP tests: a fake engine, settings, and the app over them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI

from gclm.paths import default_cache_dir
from gclm.server.app import create_app
from gclm.server.openai.responses.store import ResponseStore
from gclm.server.settings import ServerSettings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _stored_responses_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> None:
    """An app made with ServerSettings() stores its responses in a temporary directory, not
    in the user's cache (a test that names its cache_dir or responses_db keeps it)."""
    opened = ResponseStore.open.__func__  # type: ignore[attr-defined]
    tmp = tmp_path_factory.getbasetemp() / "responses"

    def open_elsewhere(cls: type[ResponseStore], settings: ServerSettings) -> Any:
        if settings.responses_db is None and settings.cache_dir == default_cache_dir():
            settings = dataclasses.replace(settings, cache_dir=tmp)
        return opened(cls, settings)

    monkeypatch.setattr(ResponseStore, "open", classmethod(open_elsewhere))


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def settings(tmp_path) -> ServerSettings:
    return ServerSettings(cache_dir=tmp_path)


@pytest.fixture
def app(engine: FakeEngine, settings: ServerSettings) -> FastAPI:
    return create_app(engine, settings)


# The end-to-end tests' real server (tests/server/e2e_server.py), started on first use, and
# the openai SDK on it.
from e2e_server import client, gclm_server  # noqa: E402, F401

# The embedded model made to think (e2e_thinking_server.py), shared by the reasoning modules.
from e2e_thinking_server import thinking_server  # noqa: E402, F401

# `gclm serve --engine vllm`, shared by vLLM's end-to-end modules (e2e_vllm_server.py).
from e2e_vllm_server import vllm_gclm_servers  # noqa: E402, F401


@pytest.fixture(scope="session")
def float32_engine(embedded_vocab):
    """`float32_engine(draft_tokens, max_batched_tokens=None, prefill_thread=False)`: a
    BatchEngine on the embedded model in float32 (a row's logits do not depend on the pass it
    ran in, so outputs compare to the bit), 4 slots, every prompt prefilled on the engine
    thread unless `prefill_thread`; one per set of arguments, sharing the model and a table
    cache, shut down at the end."""
    from gclm.compiler.service.cache import TableCache
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.server.engine.model_loader import load_model
    from gclm.server.engine.transformers.engine import BatchEngine

    loaded = load_model(None, device="cpu", dtype="float32")
    cache = TableCache(lambda c: compile_constraint(c, embedded_vocab), embedded_vocab.fingerprint)
    built: dict[tuple[int, int | None, bool], BatchEngine] = {}

    def get(
        draft_tokens: int, max_batched_tokens: int | None = None, prefill_thread: bool = False
    ) -> BatchEngine:
        key = (draft_tokens, max_batched_tokens, prefill_thread)
        if key not in built:
            built[key] = BatchEngine(
                loaded.model,
                loaded.tokenizer,
                model_id="smol",
                vocab=embedded_vocab,
                cache=cache,
                max_batch=4,
                kv_memory=256 << 20,
                draft_tokens=draft_tokens,
                max_batched_tokens=max_batched_tokens,
                prefill_thread=prefill_thread,
            )
        return built[key]

    yield get
    for engine in built.values():
        engine.shutdown()


@pytest.fixture(scope="session")
def tiny_batch_engine(embedded_tokenizer, embedded_vocab, tiny_llama):
    """`tiny_batch_engine(cache=None, **config)` builds a BatchEngine on a one-layer random
    Llama over the embedded vocabulary (`config`: LlamaConfig fields that differ; the caller
    shuts it down); `cache` None: compiles in process."""
    from gclm.compiler.service.cache import TableCache
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.server.engine.transformers.engine import BatchEngine

    def build(cache: TableCache | None = None, **config: Any) -> BatchEngine:
        shape = {
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 256,
        }
        model = tiny_llama(
            vocab_size=embedded_vocab.size,
            eos_token_id=embedded_tokenizer.eos_token_id,
            **(shape | config),
        )
        if cache is None:
            cache = TableCache(
                lambda c: compile_constraint(c, embedded_vocab), embedded_vocab.fingerprint
            )
        return BatchEngine(
            model, embedded_tokenizer, model_id="tiny", vocab=embedded_vocab, cache=cache
        )

    return build


# Every forward pass the KV store runs (the engine tests).
from pass_spy import passes  # noqa: E402, F401
