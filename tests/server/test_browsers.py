"""What a web page can make a browser do: bodies must be JSON (415), CORS is off unless
configured, and a Host allow-list (server/http/browsers.py)."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine
from fastapi import FastAPI
from harness import http_client

from gclm.server.app import create_app
from gclm.server.settings import ServerSettings

pytestmark = pytest.mark.anyio

BODY = b'{"prompt": "Hi", "max_tokens": 2}'
PAGE = "https://page.example"


def app_with(tmp_path, **settings) -> FastAPI:
    return create_app(FakeEngine(), ServerSettings(cache_dir=tmp_path, **settings))


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_declared_json_is_a_415(app: FastAPI, content_type) -> None:
    headers = {"content-type": content_type} if content_type else {}
    async with http_client(app) as http:
        response = await http.post("/v1/completions", content=BODY, headers=headers)
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert "application/json" in response.json()["error"]["message"]


async def test_json_with_a_charset_is_accepted(app: FastAPI) -> None:
    headers = {"content-type": "Application/JSON; charset=utf-8"}
    async with http_client(app) as http:
        response = await http.post("/v1/completions", content=BODY, headers=headers)
    assert response.status_code == 200


async def test_cors_is_off_by_default(app: FastAPI) -> None:
    preflight = {"origin": PAGE, "access-control-request-method": "POST"}
    async with http_client(app) as http:
        options = await http.options("/v1/completions", headers=preflight)
        post = await http.post(
            "/v1/completions", content=BODY, headers={"origin": PAGE, **JSON_TYPE}
        )
    assert options.status_code == 405
    assert "access-control-allow-origin" not in options.headers
    assert "access-control-allow-origin" not in post.headers


async def test_cors_allows_the_configured_origins_only(tmp_path) -> None:
    app = app_with(tmp_path, cors_origins=f"{PAGE}, https://other.example")
    async with http_client(app) as http:
        allowed = await http.options(
            "/v1/completions",
            headers={"origin": PAGE, "access-control-request-method": "POST"},
        )
        refused = await http.options(
            "/v1/completions",
            headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
        )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == PAGE
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers


async def test_hosts_outside_the_allow_list_are_refused(tmp_path) -> None:
    app = app_with(tmp_path, allowed_hosts="localhost,127.0.0.1")
    async with http_client(app) as http:
        local = await http.get("/health", headers={"host": "localhost:8000"})
        rebound = await http.get("/health", headers={"host": "attacker.example"})
    assert local.status_code == 200
    assert rebound.status_code == 400
    assert rebound.json()["error"]["code"] == "invalid_host"


JSON_TYPE = {"content-type": "application/json"}
