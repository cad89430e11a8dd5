"""gclm next to vLLM: the same model, requests and machine, one server after the other.

    .venv-vllm/bin/python -m bench.peers [--json PATH] [--markdown PATH] [--quick]
                                         [--cores LIST] [--eager] [--repeats N]
                                         [--baseline PYTHON]

Three systems serve the embedded SmolLM2-135M-Instruct on CPU, one at a time:

    gclm           `gclm serve` (transformers engine), 1 intra-op thread
    gclm-vllm      `gclm serve --engine vllm` (vLLM's AsyncLLM + gclm's logits processor)
    vllm           vLLM's own OpenAI server, its default structured outputs (xgrammar)

vLLM's threads are bound to `--cores` (a core list, default "1": one core, like gclm's).
Every system loads the weights in `--dtype` (default bfloat16: the model's own dtype, and
gclm's default on a CPU with bf16 instructions). vLLM gets --max-num-seqs 32;
gclm sizes its batch from its KV memory (`--max-batch` unset), which gives it 32 or more.
The servers are up together and take turns cell by cell (only one is ever under load), each
cell run `--repeats` times, so that the machine's changing load (it is shared) hits them
alike; tokens/s is the median of the repeats. Each gets the same chat
requests with a 5-property JSON Schema (response_format), T=0.7,
in a closed loop at concurrency 1, 8, 16 and 32 (each worker sends `--per-worker` requests
per run, 6 by default: with 2, the last wave's drain decided a cell, and it costs most the
system whose output lengths vary), at a generous budget (96 tokens) and a tight one (gclm's
minimum for the schema + 4). Per cell: completion tokens/s over wall time,
p50/p99 latency, % schema-valid (json.loads + jsonschema), finish reasons, and where gclm
refuses a budget the 400 count. The ratio gclm-vllm / vllm of tokens/s is the mask's cost
next to vLLM's own structured-output cost. `--baseline PYTHON` adds gclm-baseline, the gclm
server run by another checkout's interpreter (CHECKOUT/.venv/bin/python), taking turns
with the others: a change against the code before it, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import openai

from bench._server import ROOT, BaselineServer, GclmServer
from bench._vllm import VllmServer, vllm_env, vllm_python
from bench.serve import SCHEMAS

SCHEMA = SCHEMAS["profile"]  # name, email, city, age, bio: five required properties
PROMPTS = [
    "Write a short profile of a fictional person as JSON.",
    "Invent a customer record as JSON.",
    "Describe a new colleague as JSON.",
    "Create a user profile for a travel website as JSON.",
]
CONCURRENCY = (1, 8, 16, 32)
GENEROUS = 96
MAX_NUM_SEQS = 32


@dataclass
class Cell:
    """One system at one concurrency and budget."""

    system: str
    concurrency: int
    budget: int
    requests: int = 0
    wall_s: float = 0.0
    completion_tokens: int = 0
    latencies: list[float] = field(default_factory=list)
    valid: int = 0
    finish: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    runs: list[float] = field(default_factory=list)  # tokens/s of each repeat

    @property
    def tok_s(self) -> float:
        if self.runs:
            return statistics.median(self.runs)
        return self.completion_tokens / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None
        return {
            "system": self.system,
            "concurrency": self.concurrency,
            "budget": self.budget,
            "requests": self.requests,
            "tok_s": round(self.tok_s, 1),
            "tok_s_runs": [round(r, 1) for r in self.runs],
            "req_s": round(self.requests / self.wall_s, 3) if self.wall_s else None,
            "mean_tokens": round(self.completion_tokens / self.requests, 1)
            if self.requests
            else None,
            "p50_s": round(statistics.median(lat), 3) if lat else None,
            "p99_s": round(p99, 3) if p99 is not None else None,
            "valid_pct": round(100 * self.valid / self.requests, 1) if self.requests else None,
            "finish": dict(self.finish),
            "refused_400": self.refused,
        }


def is_valid(text: str | None) -> bool:
    try:
        jsonschema.validate(json.loads(text or ""), SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


async def run_cell(base_url: str, model: str, cell: Cell, total: int) -> Cell:
    """A closed loop: `cell.concurrency` workers, each sending its next request when the
    previous one is answered, `total` requests in all."""
    response_format = {"type": "json_schema", "json_schema": {"name": "profile", "schema": SCHEMA}}
    queue = list(range(total))
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="x", timeout=600.0, max_retries=0
    ) as client:

        async def worker() -> None:
            while queue:
                i = queue.pop()
                started = time.perf_counter()
                try:
                    reply = await client.chat.completions.create(
                        model=model,
                        messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                        max_tokens=cell.budget,
                        temperature=0.7,
                        seed=i,
                        response_format=response_format,  # type: ignore[arg-type]
                    )
                except openai.BadRequestError:
                    cell.refused += 1
                    continue
                cell.latencies.append(time.perf_counter() - started)
                cell.requests += 1
                cell.completion_tokens += reply.usage.completion_tokens if reply.usage else 0
                cell.finish[reply.choices[0].finish_reason or "none"] += 1
                cell.valid += is_valid(reply.choices[0].message.content)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
        cell.wall_s = time.perf_counter() - started
    return cell


def drive(
    servers: list[tuple[str, str]],
    model: str,
    budgets: list[int],
    concurrencies: tuple[int, ...],
    quick: bool,
    repeats: int,
    per_worker: int = 6,
) -> list[Cell]:
    """Every cell on every server, the servers taking turns cell by cell (so that a change
    in the machine's load hits them alike), `repeats` times; tokens/s is the median."""
    for system, url in servers:
        # Warm-up: the schema compiles (gclm) or its grammar is built (xgrammar) here.
        asyncio.run(run_cell(url, model, Cell(system, 2, GENEROUS), 2))
    cells = []
    for budget in budgets:
        for concurrency in concurrencies:
            total = max(concurrency * (1 if quick else per_worker), 4 if quick else 8)
            runs: dict[str, list[Cell]] = {system: [] for system, _ in servers}
            for _ in range(repeats):
                for system, url in servers:
                    one = Cell(system, concurrency, budget)
                    runs[system].append(asyncio.run(run_cell(url, model, one, total)))
            for system, _ in servers:
                cell = merge(runs[system])
                print(json.dumps(cell.summary()), flush=True)
                cells.append(cell)
    return cells


def merge(runs: list[Cell]) -> Cell:
    """One cell from repeats of it: requests pooled, tokens/s the median of the repeats'."""
    first = runs[0]
    cell = Cell(first.system, first.concurrency, first.budget)
    for run in runs:
        cell.requests += run.requests
        cell.wall_s += run.wall_s
        cell.completion_tokens += run.completion_tokens
        cell.latencies += run.latencies
        cell.valid += run.valid
        cell.finish.update(run.finish)
        cell.refused += run.refused
        cell.runs.append(run.tok_s)
    return cell


def tight_budget() -> int:
    """gclm's minimum for SCHEMA on the embedded tokenizer, + 4."""
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.vocab.vocabulary import TokenVocabulary
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.server.engine.model_loader import load_tokenizer

    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(None))
    return compile_constraint(Constraint.json_schema(SCHEMA), vocab).min_tokens + 4


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "loadavg_before": os.getloadavg(),
    }


def markdown(results: dict[str, Any]) -> str:
    rows = results["cells"]
    lines = [
        "# gclm next to vLLM (bench/peers.py)",
        "",
        f"Command: `{results['command']}`  ",
        f"Machine: {results['machine']['cpus']} CPUs, {results['machine']['platform']}; "
        f"vLLM threads bound to cores {results['cores']!r}; eager={results['eager']}; "
        f"load average before {results['machine']['loadavg_before']}, after "
        f"{results['loadavg_after']}.",
        "",
        "Embedded SmolLM2-135M-Instruct, chat requests with a 5-property JSON Schema "
        f"(response_format), T=0.7, closed loop, {results['per_worker']} requests per worker "
        "and run. `valid` = json.loads + jsonschema on the "
        "answer; `400` = requests gclm refused as below the schema's minimum. tok/s counts "
        "completion tokens, so a system whose outputs end sooner (a closed JSON, `stop`) "
        "scores lower for the same requests; requests/s (pooled over the runs) and the mean "
        "completion tokens show that side.",
        "",
        "| system | budget | conc. | tok/s (median) | tok/s of each run | requests/s | "
        "mean tokens | p50 s | p99 s | valid % | finish reasons | 400 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        finish = ", ".join(f"{k} {v}" for k, v in sorted(r["finish"].items()))
        each = " / ".join(str(v) for v in r.get("tok_s_runs", []))
        lines.append(
            f"| {r['system']} | {r['budget']} | {r['concurrency']} | {r['tok_s']} | {each} | "
            f"{r.get('req_s')} | {r.get('mean_tokens')} | {r['p50_s']} | {r['p99_s']} | "
            f"{r['valid_pct']} | {finish} | {r['refused_400']} |"
        )
    lines += [
        "",
        "Ratios of tokens/s to plain vLLM (gclm: >= 0.8 at concurrency 1 and >= 0.7 at 8 to 32 "
        "is issue 12's target; gclm-vllm: >= 0.95 at 8 and 16 was issue 11's):",
        "",
    ]
    for key, value in results["ratios"].items():
        lines.append(f"- {key}: {value}")
    return "\n".join(lines) + "\n"


def ratios(cells: list[Cell]) -> dict[str, float | None]:
    by = {(c.system, c.budget, c.concurrency): c.tok_s for c in cells}
    out: dict[str, float | None] = {}
    for system, budget, concurrency in by:
        if system == "vllm":
            continue
        plain = by.get(("vllm", budget, concurrency))
        ours = by[(system, budget, concurrency)]
        key = f"{system} / vllm, budget {budget}, concurrency {concurrency}"
        out[key] = round(ours / plain, 3) if plain else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--markdown", type=Path, help="write the table here (peers.md)")
    parser.add_argument("--quick", action="store_true", help="fewer requests per cell")
    parser.add_argument(
        "--per-worker",
        type=int,
        default=6,
        help="requests each closed-loop worker sends per run (at least 8 per run in all)",
    )
    parser.add_argument("--cores", default="1", help="VLLM_CPU_OMP_THREADS_BIND (default 1)")
    parser.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--dtype", default="bfloat16", help="every system's --dtype")
    parser.add_argument(
        "--concurrency", default=",".join(map(str, CONCURRENCY)), help="comma-separated"
    )
    parser.add_argument("--budgets", default="generous,tight", help="generous, tight or both")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each cell (median tokens/s)"
    )
    parser.add_argument(
        "--systems", default="gclm,gclm-vllm,vllm", help="comma-separated subset to run"
    )
    parser.add_argument(
        "--baseline",
        help="also gclm-baseline: gclm served by this Python (another checkout's venv)",
    )
    args = parser.parse_args()
    if not vllm_python().exists():
        print(f"vLLM's environment is missing ({vllm_python()}): run make install-vllm")
        return 2
    named = {"generous": GENEROUS, "tight": tight_budget()}
    budgets = [named[b] for b in args.budgets.split(",")]
    concurrency = tuple(int(c) for c in args.concurrency.split(","))
    info = machine()
    systems = args.systems.split(",")
    cells: list[Cell] = []
    model = "SmolLM2-135M-Instruct"
    eager = ("--enforce-eager", "on") if args.eager else ()
    env = {k: v for k, v in vllm_env(args.cores).items() if k.startswith("VLLM_")}
    default_python = ROOT / ".venv" / "bin" / "python"
    with contextlib.ExitStack() as stack:
        # The servers are up together and take turns (only one is ever loaded).
        servers: list[tuple[str, str]] = []
        if "gclm" in systems:
            python = str(default_python) if default_python.exists() else sys.executable
            gclm = GclmServer(
                max_batch=None, threads=1, python=python, extra_args=("--dtype", args.dtype)
            )
            servers.append(("gclm", stack.enter_context(gclm).url))
        if args.baseline:
            before = BaselineServer(
                max_batch=None, threads=1, python=args.baseline, extra_args=("--dtype", args.dtype)
            )
            servers.append(("gclm-baseline", stack.enter_context(before).url))
        if "gclm-vllm" in systems:
            extra = ("--engine", "vllm", "--max-model-len", "2048", "--dtype", args.dtype, *eager)
            ours = GclmServer(
                max_batch=MAX_NUM_SEQS,
                extra_args=extra,
                python=str(vllm_python()),
                env=env,
                startup_timeout=600,
            )
            servers.append(("gclm-vllm", stack.enter_context(ours).url))
        if "vllm" in systems:
            plain = VllmServer(
                logits_processor=False,
                max_num_seqs=MAX_NUM_SEQS,
                eager=args.eager,
                threads_bind=args.cores,
                startup_timeout=600,
                dtype=args.dtype,
            )
            servers.append(("vllm", stack.enter_context(plain).url))
        if servers:
            cells += drive(
                servers, model, budgets, concurrency, args.quick, args.repeats, args.per_worker
            )
    results = {
        "command": "python -m bench.peers " + " ".join(sys.argv[1:]),
        "machine": info,
        "cores": args.cores,
        "eager": args.eager,
        "per_worker": args.per_worker,
        "dtype": args.dtype,
        "budgets": budgets,
        "cells": [c.summary() for c in cells],
        "ratios": ratios(cells),
        "loadavg_after": os.getloadavg(),
    }
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
