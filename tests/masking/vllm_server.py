"""Helpers for the vLLM tests: whether vLLM's environment is here; requests and refusals.

`make test-vllm` sets GCLM_REQUIRE_VLLM=1: there a missing vLLM fails the run instead of
skipping it, so CI cannot pass without having run these tests.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import openai
import pytest

from bench._vllm import SERVED_NAME, vllm_python

MODEL = SERVED_NAME


def need_vllm_environment() -> None:
    """Skip (or, under GCLM_REQUIRE_VLLM=1, fail) without vLLM's environment."""
    if not vllm_python().exists():
        message = f"vLLM's environment is missing ({vllm_python()}); run `make install-vllm`"
        if os.environ.get("GCLM_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)


def xargs(constraint: dict[str, Any]) -> dict[str, Any]:
    """The request body field that asks gclm's processor for `constraint`."""
    return {"vllm_xargs": {"gclm": json.dumps(constraint)}}


def min_tokens_from_400(error: openai.BadRequestError) -> int:
    """The minimum budget named by gclm's refusal."""
    found = re.search(r"Set max_tokens to at least (\d+)\.", error.message)
    assert found, error.message
    return int(found.group(1))
