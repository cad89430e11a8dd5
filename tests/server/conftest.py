"""Fixtures for the HTTP tests: a fake engine, settings, and the app over them."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI

from gclm.server.app import create_app
from gclm.server.settings import ServerSettings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
