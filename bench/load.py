"""Serving under load: long prompts beside running streams, and bursts past the batch.

    python -m bench.load [--scenario a c prefill] [--prompt-tokens 4000] [--streams 6]
                         [--sizes 1000 2000] [--burst 150] [--no-vllm] [--peers NAME...]
                         [--dtype bfloat16] [--baseline PYTHON] [--json PATH]

Each scenario starts its servers on 127.0.0.1 (the embedded model, CPU, every server in
`--dtype`: bfloat16 by default, gclm's own default on a CPU with bf16 instructions;
float32 for a CPU without them), one after another in one run, and prints the ratios:

    (a) stall     `--streams` streams decode; a `--prompt-tokens` prompt arrives. The
                  running streams' largest gap between two tokens while it is prefilled,
                  and its time to first token: gclm as served by default (on a CPU with
                  a core to spare, the long prompt on a thread of its own beside the
                  steps: --prefill-thread), gclm prefilling on the engine thread
                  (chunks timed by --max-step-seconds), gclm untimed (chunks of the
                  token budget, --max-num-batched-tokens, alone), gclm unchunked (a
                  budget past the prompt, one pass), and vLLM-CPU (`--peers` picks
                  some). Targets: gap <= 1.0 s on 2 cores; the default's TTFT within
                  1.3x of unchunked. Each server gets two long prompts: its first
                  (gclm grows its KV buffers then, once) and another (`again`).
    (c) burst     `--burst` two-token requests at once on a server with its default slots:
                  how many got 200, how many 429 (and their Retry-After), and the KV
                  slots free by /metrics. Target: no 429 while slots are free.
    prefill       time to first token of a prompt of each of `--sizes` tokens, alone:
                  gclm against vLLM-CPU (target >= 1.0x its speed), both servers up,
                  taking turns prompt by prompt; the median of `--prompts` prompts.
                  `--baseline` adds a third, the default gclm server run by another
                  checkout's interpreter (its .venv/bin/python: before and after a change,
                  in one run).

Scenarios (b) (new schemas under load) and (d) (compile bombs) are the compile pool's:
bench/compile_load.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import re
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from bench._server import BaselineServer, GclmServer
from bench._vllm import SERVED_NAME, VllmServer

STORY = "Once upon a time, in a town by a river, there lived"
ENGINE_THREAD = ("--prefill-thread", "off")  # every prompt prefilled between the steps
UNTIMED = ("--max-step-seconds", "0", *ENGINE_THREAD)  # chunks of the token budget alone
UNCHUNKED = ("--max-num-batched-tokens", "1000000", *UNTIMED)
WORDS = (
    "river map library lantern harbor orchard meadow glacier canyon market bridge tower "
    "garden forest island valley desert village castle mountain painter sailor farmer baker"
).split()


def long_prompt(tokens: int, seed: int) -> str:
    """About `tokens` tokens of distinct text (a word is about one token here)."""
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(tokens - 8)]
    return f"Notes {seed}: " + " ".join(words) + "\nSummary:"


async def stream_times(
    client: httpx.AsyncClient, model: str, body: dict[str, Any], times: list[float] | None = None
) -> list[float]:
    """The arrival time (perf_counter) of each streamed chunk that carries text, appended to
    `times` as they come (a new list by default)."""
    times = [] if times is None else times
    payload = {"model": model, "stream": True, **body}
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if any(c.get("text") for c in chunk.get("choices", [])):
                    times.append(time.perf_counter())
    return times


async def stall(url: str, model: str, prompt_tokens: int, streams: int) -> dict[str, Any]:
    """Scenario (a) on one server, twice: a fresh server's first long prompt (gclm's KV
    buffers grow to hold it then: a one-time copy), then another of the same size once the
    server has held one (`again`: a server's steady state)."""
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as client:
        await stream_times(client, model, {"prompt": "Warm up.", "max_tokens": 2})
        first = await _stall_once(client, model, prompt_tokens, streams, seed=prompt_tokens)
        again = await _stall_once(client, model, prompt_tokens, streams, seed=prompt_tokens + 1)
    return {**first, "again": again}


async def _stall_once(
    client: httpx.AsyncClient, model: str, prompt_tokens: int, streams: int, seed: int
) -> dict[str, Any]:
    """The long prompt is sent once every stream has streamed three chunks; a gap counts
    when it overlaps the prefill (first token included)."""
    stamps: list[list[float]] = [[] for _ in range(streams)]
    runners = [
        asyncio.ensure_future(
            stream_times(
                client,
                model,
                {"prompt": STORY, "max_tokens": 1500, "temperature": 1.0, "seed": i},
                stamps[i],
            )
        )
        for i in range(streams)
    ]
    while min(map(len, stamps)) < 3:
        if any(r.done() for r in runners):
            raise RuntimeError("a stream ended before the long prompt was sent")
        await asyncio.sleep(0.05)
    sent = time.perf_counter()
    long = long_prompt(prompt_tokens, seed=seed)
    times = await stream_times(client, model, {"prompt": long, "max_tokens": 1})
    first = times[0] if times else time.perf_counter()
    await asyncio.sleep(0.5)  # the running streams' next token after the prefill
    alive = sum(not r.done() for r in runners)
    for r in runners:
        r.cancel()
    await asyncio.gather(*runners, return_exceptions=True)
    gaps = []
    for row in stamps:
        edges = [t for t in row if t < sent][-1:] + [t for t in row if t >= sent]
        gaps += [b - a for a, b in zip(edges, edges[1:], strict=False) if b > sent and a < first]
    return {
        "ttft_s": round(first - sent, 2),
        "max_gap_s": round(max(gaps), 2) if gaps else None,
        "streams_alive": alive,
    }


async def burst(url: str, model: str, count: int) -> dict[str, Any]:
    """Scenario (c) on one server."""
    limits = httpx.Limits(max_connections=count + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one(i: int) -> tuple[int, str | None]:
            body = {"model": model, "prompt": f"Request {i}: yes or no?", "max_tokens": 2}
            response = await client.post("/v1/completions", json=body)
            return response.status_code, response.headers.get("retry-after")

        answers = await asyncio.gather(*(one(i) for i in range(count)))
        metrics = (await client.get("/metrics")).text
    statuses = [s for s, _ in answers]
    return {
        "ok": statuses.count(200),
        "queue_full": statuses.count(429),
        "other": len(statuses) - statuses.count(200) - statuses.count(429),
        "retry_after_s": sorted({int(r) for s, r in answers if s == 429 and r}),
        "kv_slots": _metric(metrics, "gclm_engine_batch_slots"),
        "kv_slots_free_after": _metric(metrics, "gclm_kv_slots_free"),
        "queue_full_rejections": _metric(metrics, "gclm_queue_full_rejections_total"),
    }


def _metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def first_token_s(client: httpx.AsyncClient, model: str, prompt: str) -> float:
    """Seconds from sending `prompt` to its first streamed token."""
    sent = time.perf_counter()
    times = await stream_times(client, model, {"prompt": prompt, "max_tokens": 1})
    return (times[0] if times else time.perf_counter()) - sent


async def ttft(urls: dict[str, str], model: str, sizes: list[int], prompts: int) -> dict:
    """Scenario prefill: the servers up together take turns prompt by prompt (so that the
    shared machine's changing load hits them alike), `prompts` distinct prompts per size;
    each server's median time to first token per size, and each prompt's."""
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in urls}
    clients = {name: httpx.AsyncClient(base_url=url, timeout=900) for name, url in urls.items()}
    try:
        for client in clients.values():
            await stream_times(client, model, {"prompt": "Warm up.", "max_tokens": 2})
        for size in sizes:
            for seed in range(1, prompts + 1):
                prompt = long_prompt(size, seed + size)
                for name, client in clients.items():
                    seconds = await first_token_s(client, model, prompt)
                    runs[name].setdefault(str(size), []).append(round(seconds, 3))
    finally:
        for client in clients.values():
            await client.aclose()
    return {
        name: {"median_s": {k: statistics.median(v) for k, v in by.items()}, "runs_s": by}
        for name, by in runs.items()
    }


def servers(vllm: bool, prompt_tokens: int, dtype: str) -> dict[str, Any]:
    """The servers a scenario compares, by name (started lazily, one at a time), every one
    loading the weights in `dtype`."""
    room = ("--max-model-len", str(max(2048, prompt_tokens + 2048)))
    weights = ("--dtype", dtype)
    peers: dict[str, Any] = {
        "gclm": lambda: GclmServer(max_batch=8, extra_args=weights),
        "gclm_engine_thread": lambda: GclmServer(max_batch=8, extra_args=weights + ENGINE_THREAD),
        "gclm_untimed": lambda: GclmServer(max_batch=8, extra_args=weights + UNTIMED),
        "gclm_unchunked": lambda: GclmServer(max_batch=8, extra_args=weights + UNCHUNKED),
    }
    if vllm:
        peers["vllm"] = lambda: VllmServer(
            logits_processor=False, max_num_seqs=8, extra_args=room, dtype=dtype
        )
    return peers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", nargs="+", default=["a", "c"], choices=["a", "c", "prefill"])
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--burst", type=int, default=150)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per size (prefill)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--peers", nargs="+", help="scenario (a)'s servers, by name (default all)")
    parser.add_argument(
        "--dtype", default="bfloat16", help="every server's --dtype (float32 where no bf16)"
    )
    parser.add_argument(
        "--baseline", help="prefill: also gclm served by this Python (another checkout's venv)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": {"cpus": platform.processor() or platform.machine()},
        "dtype": args.dtype,
    }
    peers = servers(not args.no_vllm, max(args.prompt_tokens, *args.sizes), args.dtype)
    if "c" in args.scenario:
        with GclmServer(max_batch=None, extra_args=("--dtype", args.dtype)) as server:
            results["c"] = asyncio.run(burst(server.url, SERVED_NAME, args.burst))
        print("gclm (c)", results["c"], flush=True)
    if "a" in args.scenario:
        results["a"] = {}
        for name, build in peers.items():
            if args.peers and name not in args.peers:
                continue
            with build() as server:
                run = stall(server.url, SERVED_NAME, args.prompt_tokens, args.streams)
                results["a"][name] = asyncio.run(run)
            print(name, "(a)", results["a"][name], flush=True)
        a = results["a"]
        if "gclm" in a and "gclm_unchunked" in a:
            a["ttft_chunked_over_unchunked"] = round(
                a["gclm"]["ttft_s"] / a["gclm_unchunked"]["ttft_s"], 2
            )
            a["again_ttft_chunked_over_unchunked"] = round(
                a["gclm"]["again"]["ttft_s"] / a["gclm_unchunked"]["again"]["ttft_s"], 2
            )
    if "prefill" in args.scenario:
        names = ("gclm", "vllm") if not args.no_vllm else ("gclm",)
        if args.baseline:
            weights = ("--dtype", args.dtype)
            peers["gclm_baseline"] = lambda: BaselineServer(
                max_batch=8, extra_args=weights, python=args.baseline
            )
            names = (*names, "gclm_baseline")
        with contextlib.ExitStack() as stack:
            urls = {name: stack.enter_context(peers[name]()).url for name in names}
            results["prefill"] = asyncio.run(ttft(urls, SERVED_NAME, args.sizes, args.prompts))
        print("prefill ttft", results["prefill"], flush=True)
        if "vllm" in results["prefill"]:
            g = results["prefill"]["gclm"]["median_s"]
            v = results["prefill"]["vllm"]["median_s"]
            results["prefill"]["speed_vs_vllm"] = {k: round(v[k] / g[k], 2) for k in g}
            if "gclm_baseline" in results["prefill"]:
                b = results["prefill"]["gclm_baseline"]["median_s"]
                speed = {k: round(v[k] / b[k], 2) for k in b}
                results["prefill"]["baseline_speed_vs_vllm"] = speed
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
