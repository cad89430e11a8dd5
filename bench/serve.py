"""Serving throughput and latency: constrained vs unconstrained through gclm, vs model.generate.

    python -m bench.serve [--json PATH] [--quick] [--max-batch N] [--threads N]
                          [--baseline-threads N ...]

Starts `gclm serve` (embedded SmolLM2-135M-Instruct, CPU) in a subprocess and drives it with
httpx at concurrency 1, 8, 16 and 32 (closed loop: each of C workers sends its next request when
the previous one ends), every request streamed, greedy, with the same max_tokens:

    (a) constrained     response_format json_schema, a few realistic schemas
    (b) unconstrained   the same chat prompts, no constraint
    (c) generate        in-process `model.generate()` on the same model and prompts, greedy,
                        one prompt at a time (the server stopped by then)

Per arm and concurrency: output tokens/s (completion tokens over wall time, which normalises
for outputs that end early at EOS or when the JSON closes), p50/p99 latency and p50/p99 time
to first token (the first content delta). Medians over repeats. Ratios:

    constrained_ratio     = (a) tokens/s / (b) tokens/s at concurrency 8   (target >= 0.9)
    batching_speedup_c8   = (b) tokens/s at concurrency 8 / (c) tokens/s   (target >= 3)
    constrained / unconstrained at each concurrency: the median over repeats of each
    repeat's (a) / (b), the two run back to back (target >= 0.95)

(c) runs at the server's intra-op thread count (and at each --baseline-threads N; the
fastest is the one compared). Schemas are compiled during warm-up, so compile time is not
in the figures. The machine (cores, load average before and after) is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench._server import GclmServer

STR = {"type": "string"}
INT = {"type": "integer"}


def obj(**props: Any) -> dict[str, Any]:
    """An object schema whose properties are all required."""
    return {"type": "object", "properties": props, "required": list(props)}


SCHEMAS: dict[str, dict[str, Any]] = {
    "profile": obj(
        name=STR, email=STR, city=STR, age={**INT, "minimum": 0, "maximum": 120}, bio=STR
    ),
    "article": obj(
        title=STR,
        tags={"type": "array", "items": STR, "maxItems": 4},
        author=obj(name=STR, affiliation=STR),
        summary=STR,
    ),
    "order": obj(
        order_id=STR,
        status={"enum": ["pending", "paid", "shipped", "delivered"]},
        items={
            "type": "array",
            "items": obj(sku=STR, quantity={**INT, "minimum": 1}, price={"type": "number"}),
            "maxItems": 3,
        },
        note=STR,
    ),
    "event": obj(
        name=STR,
        date={"type": "string", "pattern": "[0-9]{4}-[0-9]{2}-[0-9]{2}"},
        location=obj(city=STR, country=STR),
        attendees={**INT, "minimum": 0},
        description=STR,
    ),
}
PROMPTS = [
    ("profile", "Invent a user profile for a software engineer in Lisbon and give it as JSON."),
    ("article", "Write a JSON record describing a news article about renewable energy."),
    ("order", "Give the JSON for an online order of two books and a lamp."),
    ("event", "Describe a music festival in Berlin next summer as a JSON object."),
    ("profile", "Create a JSON profile for a retired teacher who loves gardening."),
    ("article", "Summarise a blog post about learning Rust as a JSON article record."),
    ("order", "Produce a JSON order for a customer buying running shoes."),
    ("event", "Give a JSON description of a science conference in Tokyo."),
]
CONCURRENCY = (1, 8, 16, 32)


@dataclass
class Plan:
    max_tokens: int
    repeats: int
    requests: dict[int, int]  # concurrency -> requests per run
    baseline_prompts: int


# max_tokens leaves room past the largest schema minimum (event: 36 tokens).
FULL = Plan(max_tokens=48, repeats=5, requests={1: 3, 8: 16, 16: 32, 32: 64}, baseline_prompts=4)
QUICK = Plan(max_tokens=40, repeats=1, requests={1: 1, 8: 8, 16: 16, 32: 32}, baseline_prompts=1)


@dataclass
class Run:
    tokens: int
    wall_s: float
    latencies: list[float]
    ttfts: list[float]
    texts: list[str]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s


def messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def body(i: int, constrained: bool, max_tokens: int) -> dict[str, Any]:
    schema_name, prompt = PROMPTS[i % len(PROMPTS)]
    request: dict[str, Any] = {
        "messages": messages(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if constrained:
        request["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": schema_name, "schema": SCHEMAS[schema_name]},
        }
    return request


async def one_request(
    client: httpx.AsyncClient, payload: dict[str, Any]
) -> tuple[float, float, int, str]:
    """(latency, time to first token, completion tokens, text) of one streamed request."""
    started = time.perf_counter()
    first: float | None = None
    tokens, pieces = 0, []
    async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    first = first if first is not None else time.perf_counter() - started
                    pieces.append(text)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - started
    return latency, first if first is not None else latency, tokens, "".join(pieces)


async def closed_loop(url: str, concurrency: int, payloads: list[dict[str, Any]]) -> Run:
    """`concurrency` workers share the payloads; each sends its next when one ends."""
    todo = list(enumerate(payloads))
    results: list[tuple[float, float, int, str]] = [(0.0, 0.0, 0, "")] * len(payloads)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=900.0, limits=limits) as client:

        async def worker() -> None:
            while todo:
                index, payload = todo.pop(0)
                results[index] = await one_request(client, payload)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return Run(
        tokens=sum(r[2] for r in results),
        wall_s=wall,
        latencies=[r[0] for r in results],
        ttfts=[r[1] for r in results],
        texts=[r[3] for r in results],
    )


def summarise(runs: list[Run]) -> dict[str, Any]:
    """Medians over repeats of each run's tokens/s and latency percentiles."""

    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    return {
        "tok_s": med([r.tok_s for r in runs]),
        "p50_latency_s": med([float(np.percentile(r.latencies, 50)) for r in runs]),
        "p99_latency_s": med([float(np.percentile(r.latencies, 99)) for r in runs]),
        "p50_ttft_s": med([float(np.percentile(r.ttfts, 50)) for r in runs]),
        "p99_ttft_s": med([float(np.percentile(r.ttfts, 99)) for r in runs]),
        "tokens_per_request": med([r.tokens / len(r.latencies) for r in runs]),
        "requests": len(runs[0].latencies),
        "repeats": len(runs),
    }


class Generate:
    """Arm (c): the model in this process, `model.generate()` greedy, one prompt at a time."""

    def __init__(self, plan: Plan) -> None:
        import torch

        from gclm.server.engine.model_loader import load_model

        loaded = load_model(None, device="cpu")
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.max_tokens = plan.max_tokens
        self.prompts = [
            self.encode(PROMPTS[i % len(PROMPTS)][1]) for i in range(plan.baseline_prompts)
        ]
        with torch.inference_mode():
            self.model.generate(self.prompts[0], max_new_tokens=4, do_sample=False)  # warm-up

    def encode(self, prompt: str) -> Any:
        import torch

        # As the server does: render the chat template, then encode the text.
        text = self.tokenizer.apply_chat_template(
            messages(prompt), tokenize=False, add_generation_prompt=True
        )
        return torch.tensor([self.tokenizer.encode(text, add_special_tokens=True)])

    def run(self, threads: int) -> Run:
        import torch

        torch.set_num_threads(threads)
        eos = self.tokenizer.eos_token_id
        latencies, tokens, texts = [], 0, []
        started = time.perf_counter()
        with torch.inference_mode():
            for ids in self.prompts:
                t = time.perf_counter()
                out = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=self.max_tokens,
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                )
                latencies.append(time.perf_counter() - t)
                new = out[0, ids.shape[1] :].tolist()
                tokens += len(new)
                texts.append(self.tokenizer.decode([t for t in new if t != eos]))
        return Run(tokens, time.perf_counter() - started, latencies, latencies, texts)


def bench(
    plan: Plan, max_batch: int | None, threads: int | None, generate_threads: list[int]
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Every arm, repeats interleaved (a, b at each concurrency, b first every other repeat,
    then c) so that a change in the machine's load during the run touches every arm alike.

    Returns the summaries, the unconstrained texts at concurrency 1 and generate()'s texts.
    """
    runs: dict[str, dict[Any, list[Run]]] = {
        "constrained": {c: [] for c in CONCURRENCY},
        "unconstrained": {c: [] for c in CONCURRENCY},
        "generate": {t: [] for t in generate_threads},
    }
    baseline = Generate(plan)
    with GclmServer(max_batch=max_batch, threads=threads) as server:
        # Warm-up: compiles every schema (cached from then on) and touches every code path.
        warm = [body(i, True, plan.max_tokens) for i in range(len(SCHEMAS))]
        warm.append(body(0, False, plan.max_tokens))
        asyncio.run(closed_loop(server.url, len(warm), warm))
        for repeat in range(plan.repeats):
            print(f"repeat {repeat + 1}/{plan.repeats}", flush=True)
            for concurrency in CONCURRENCY:
                arms = (("constrained", True), ("unconstrained", False))
                for arm, constrained in arms[:: 1 if repeat % 2 == 0 else -1]:
                    count = plan.requests[concurrency]
                    payloads = [body(i, constrained, plan.max_tokens) for i in range(count)]
                    run = asyncio.run(closed_loop(server.url, concurrency, payloads))
                    runs[arm][concurrency].append(run)
                    print(f"  {arm:13s} c={concurrency:<3d} {run.tokens:5d} tokens in "
                          f"{run.wall_s:6.1f} s = {run.tok_s:6.1f} tok/s", flush=True)  # fmt: skip
            # The server idles meanwhile (its engine thread waits on a condition).
            for n in generate_threads:
                run = baseline.run(n)
                runs["generate"][n].append(run)
                print(f"  generate      threads={n} {run.tokens:5d} tokens in "
                      f"{run.wall_s:6.1f} s = {run.tok_s:6.1f} tok/s", flush=True)  # fmt: skip
    results: dict[str, Any] = {
        arm: {key: summarise(arm_runs) for key, arm_runs in by_key.items()}
        for arm, by_key in runs.items()
    }
    for summary in results["generate"].values():
        summary["p50_ttft_s"] = summary["p99_ttft_s"] = None  # not streamed
    # Each repeat's constrained / unconstrained pair ran back to back: the median of the
    # pairs' ratios is what a load change during the run moves least.
    results["paired_ratios"] = {
        c: statistics.median(
            a.tok_s / b.tok_s
            for a, b in zip(runs["constrained"][c], runs["unconstrained"][c], strict=True)
        )
        for c in CONCURRENCY
    }
    fastest = max(generate_threads, key=lambda n: results["generate"][n]["tok_s"])
    results["generate_threads"] = fastest
    return results, runs["unconstrained"][1][0].texts, runs["generate"][fastest][0].texts


def server_threads(requested: int | None) -> int:
    """The intra-op threads the server runs with (see `_leave_a_core`
    in server/engine/transformers/engine.py)."""
    import torch

    if requested is not None:
        return requested
    if "OMP_NUM_THREADS" in os.environ:
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, torch.get_num_threads() - 1)


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_default_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def table(results: dict[str, Any]) -> str:
    head = (
        f"{'arm':14s} {'conc':>4s} {'tok/s':>7s} {'tok/req':>7s} {'p50 lat':>8s} "
        f"{'p99 lat':>8s} {'p50 ttft':>8s} {'p99 ttft':>8s}"
    )
    lines = [head, "-" * len(head)]
    rows = [
        (arm, c, s) for arm in ("constrained", "unconstrained") for c, s in results[arm].items()
    ]
    rows.append(("generate", 1, results["generate"][results["generate_threads"]]))

    def secs(value: float | None) -> str:
        return f"{'-':>8s}" if value is None else f"{value:7.2f}s"

    for arm, c, s in rows:
        lines.append(
            f"{arm:14s} {c:4d} {s['tok_s']:7.1f} {s['tokens_per_request']:7.1f} "
            + " ".join(
                secs(s[k]) for k in ("p50_latency_s", "p99_latency_s", "p50_ttft_s", "p99_ttft_s")
            )
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short, one repeat")
    parser.add_argument(
        "--max-batch", type=int, help="the server's --max-batch (default: its own, from memory)"
    )
    parser.add_argument("--threads", type=int, help="server intra-op threads (OMP_NUM_THREADS)")
    parser.add_argument(
        "--baseline-threads",
        type=int,
        action="append",
        metavar="N",
        help="also run generate() with N threads (repeatable); the fastest is compared",
    )
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    info = machine()
    load_before = os.getloadavg()
    print(
        f"machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}; "
        f"load average {load_before[0]:.2f}",
        flush=True,
    )
    print(f"plan: {asdict(plan)}, server --max-batch {args.max_batch}", flush=True)

    started = time.perf_counter()
    threads = server_threads(args.threads)
    generate_threads = list(dict.fromkeys([threads, *(args.baseline_threads or ())]))
    results, server_texts, generate_texts = bench(
        plan, args.max_batch, args.threads, generate_threads
    )
    a8 = results["constrained"][8]["tok_s"]
    b8 = results["unconstrained"][8]["tok_s"]
    c = results["generate"][results["generate_threads"]]["tok_s"]
    ratios = {"constrained_ratio": a8 / b8, "batching_speedup_c8": b8 / c}
    ratios["constrained_ratio_by_concurrency"] = results.pop("paired_ratios")
    shared = min(len(server_texts), len(generate_texts))
    same = sum(server_texts[i] == generate_texts[i] for i in range(shared))
    load_after = os.getloadavg()
    report = {
        "machine": {**info, "server_threads": threads, "load_before": load_before,
                    "load_after": load_after},
        "plan": asdict(plan),
        "max_batch": args.max_batch,
        "results": results,
        "ratios": ratios,
        "greedy_same_text": f"{same}/{shared}",
        "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip

    print()
    print(
        f"{info['cpu']}, {info['cores']} cores; server: {threads} intra-op thread(s), "
        f"--max-batch {args.max_batch}; max_tokens {plan.max_tokens}, greedy; "
        f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}"
    )
    print(table(results))
    print(f"(generate: {results['generate_threads']} thread(s), one prompt at a time; no TTFT)")
    print(f"constrained_ratio   = {ratios['constrained_ratio']:.2f}  (a / b at c=8; target >= 0.9)")
    print(f"batching_speedup_c8 = {ratios['batching_speedup_c8']:.2f}  (b at c=8 / c; target >= 3)")
    paired = ", ".join(
        f"c={c}: {r:.2f}" for c, r in ratios["constrained_ratio_by_concurrency"].items()
    )
    print(f"constrained / unconstrained, median of paired repeats: {paired}")
    print(f"greedy server (c=1) and generate() texts identical: {same}/{shared}")
    print(f"total {report['seconds']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
