"""bench/compile_load.py's workload: its bodies are valid requests, and its report renders."""

from __future__ import annotations

from bench.compile_load import bombs, markdown, schema_body, small
from gclm.server.openai.chat.protocol import ChatCompletionRequest


def test_every_body_is_a_valid_chat_request_and_the_small_schemas_are_distinct() -> None:
    bodies = {**bombs(), "small": schema_body(small("x"))}
    assert len(bombs()) == 6
    for body in bodies.values():
        ChatCompletionRequest.model_validate({"model": "m", **body})
    assert small("a") != small("b")


def test_markdown_reports_every_answer() -> None:
    answer = {"status": 429, "code": "compiler_busy", "seconds": 10.1, "at_s": 10.2}
    result = {
        "settings": {
            "cores": 2,
            "schemas": 20,
            "quiet": 5,
            "streams": 6,
            "hogs": 6,
            "compile_timeout_s": 10.0,
            "compile_cpu_limit_s": 15.0,
            "attempts": 2,
        },
        "quiet_median_s": 1.0,
        "loaded_median_s": 5.0,
        "loaded_over_quiet": 5.0,
        "loaded_429s": 1,
        "loaded_200_first_try": 19,
        "loaded_200_at_retry": 1,
        "bombs": {
            "number_range": [
                {**answer, "retry_after": 12.0},
                {**answer, "status": 400, "code": "compile_limit", "retry_after": None},
            ]
        },
        "stream_answers": {200: 12},
        "metrics": {"compiles_cpu_limited_total": 1.0},
    }
    text = markdown(result, "python -m bench.compile_load")
    assert "| median latency (429 retry included) | 1.0 s | 5.0 s | 5.0x |" in text
    assert "19 of 20 answered 200 at the first try, 1 at the retry" in text
    assert "429 compiler_busy in 10.1 s (at 10.2 s, retry 12 s)" in text
    assert "400 compile_limit in 10.1 s (at 10.2 s)" in text
