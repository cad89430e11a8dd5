"""Compiles under load: new small schemas and compile bombs beside decoding streams on an
oversubscribed host, against a real `gclm serve` on 127.0.0.1 (issue 22, scenarios b and d).

    python -m bench.compile_load [--schemas 20] [--quiet 5] [--streams 6]
        [--hogs-per-core 3] [--attempts 3] [--cpu-limit S] [--json PATH] [--md PATH]

(b) `--quiet` new small schemas one by one on the idle server: the quiet median. Then the
    load (`--streams` decoding streams, `--hogs-per-core` busy processes per core, all
    stopped by `--load-s` at the latest) and `--schemas` new small schemas one by one; a
    429 is retried once, after its Retry-After. Per schema: the answers and the latency
    from the first send to the last answer (the Retry-After wait included).
(d) six compile bombs under the same load, each sent `--attempts` times, each attempt after
    the previous one's Retry-After (a 429) or at once: every answer, and when.

The baseline is the same server idle, in the same run: the figure to read is the loaded
median over the quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench._server import GclmServer

MESSAGES = [{"role": "user", "content": "Answer yes or no: is the sky blue?"}]
STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
# Seconds a Retry-After is honoured at most (a longer one is recorded, and cut).
MAX_WAIT_S = 180.0


def small(tag: str) -> dict[str, Any]:
    """A new small schema: an enum under a property name no other `tag` shares."""
    return {
        "type": "object",
        "properties": {f"answer_{tag}": {"type": "string", "enum": ["yes", "no", "maybe"]}},
        "required": [f"answer_{tag}"],
    }


def schema_body(schema: dict[str, Any], max_tokens: int = 24) -> dict[str, Any]:
    return {
        "messages": MESSAGES,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def bombs() -> dict[str, dict[str, Any]]:
    """Six request bodies whose constraints are costly to compile, by name."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
        for i in range(1000)
    ]
    alternation = "|".join(f"w{i}x{i * 7919 % 100003}" for i in range(5000))
    return {
        "number_range": schema_body(
            {"type": "number", "minimum": -1.000017e20, "maximum": 1.100013e20}
        ),
        "tools_1000": {
            "messages": MESSAGES,
            "tools": tools,
            "tool_choice": "required",
            "max_tokens": 64,
            "temperature": 0,
        },
        "min_length_1e9": schema_body({"type": "string", "minLength": 1_000_000_000}),
        "regex_5000_way": {
            "messages": MESSAGES,
            "structured_outputs": {"regex": alternation},
            "max_tokens": 24,
            "temperature": 0,
        },
        "six_free_texts": schema_body(
            {
                "type": "object",
                "properties": {f"f{j}": {"type": "string", "maxLength": 400} for j in range(6)},
            }
        ),
        "array_of_texts": schema_body(
            {"type": "array", "items": {"type": "string", "maxLength": 120}, "maxItems": 40}
        ),
    }


@dataclass
class Answer:
    status: int
    code: str | None
    seconds: float  # from this send to its answer
    at_s: float  # the answer's time since the scenario started
    retry_after: float | None


def send(client: httpx.Client, body: dict[str, Any], t0: float) -> Answer:
    started = time.monotonic()
    response = client.post("/v1/chat/completions", json=body)
    code = None
    if response.status_code != 200:
        try:
            code = response.json()["error"].get("code")
        except (ValueError, KeyError, TypeError):
            code = None
    retry = response.headers.get("retry-after-ms")
    now = time.monotonic()
    return Answer(
        response.status_code,
        code,
        round(now - started, 2),
        round(now - t0, 1),
        None if retry is None else int(retry) / 1000,
    )


class Load:
    """Decoding streams and busy processes, until `stop()` or `limit_s`."""

    def __init__(self, url: str, streams: int, hogs: int, limit_s: float) -> None:
        self.deadline = time.monotonic() + limit_s
        self._stop = threading.Event()
        self.statuses: dict[int, int] = {}  # the streams' answers, by HTTP status
        spin = f"import time\nend = time.time() + {limit_s}\nwhile time.time() < end: pass\n"
        self._hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(hogs)]
        self._threads = [
            threading.Thread(target=self._decode, args=(url,), daemon=True) for _ in range(streams)
        ]
        for thread in self._threads:
            thread.start()

    def _decode(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                body = {"messages": STORY, "max_tokens": 64, "temperature": 0.8}
                status = client.post("/v1/chat/completions", json=body).status_code
                self.statuses[status] = self.statuses.get(status, 0) + 1
                if status != 200:
                    time.sleep(1)  # a refusal is answered at once: do not spin on it

    def stop(self) -> None:
        self._stop.set()
        for hog in self._hogs:
            hog.kill()
            hog.wait()
        for thread in self._threads:
            thread.join(120)


def one_schema(client: httpx.Client, body: dict[str, Any], t0: float) -> dict[str, Any]:
    """Send; after a 429, wait its Retry-After and send once more."""
    started = time.monotonic()
    answers = [send(client, body, t0)]
    if answers[0].status == 429 and answers[0].retry_after is not None:
        time.sleep(min(answers[0].retry_after, MAX_WAIT_S))
        answers.append(send(client, body, t0))
    return {
        "statuses": [a.status for a in answers],
        "retry_after": [a.retry_after for a in answers if a.retry_after is not None],
        "latency_s": round(time.monotonic() - started, 2),
    }


def attempts(client: httpx.Client, body: dict[str, Any], n: int, t0: float) -> list[Answer]:
    """`n` sends, each after the previous answer's Retry-After (at once after another)."""
    answers = []
    for _ in range(n):
        answer = send(client, body, t0)
        answers.append(answer)
        if answer.status == 429 and answer.retry_after is not None:
            time.sleep(min(answer.retry_after, MAX_WAIT_S))
    return answers


def metrics(client: httpx.Client) -> dict[str, float]:
    wanted = (
        "gclm_compile_cpu_seconds_total",
        "gclm_compiles_sent_to_background_total",
        "gclm_compiles_cpu_limited_total",
        "gclm_table_cache_negative_entries",
        "gclm_compiles_background",
    )
    out = {}
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[name.removeprefix("gclm_")] = float(value)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    extra = ("--compile-timeout", str(args.compile_timeout))
    if args.cpu_limit:
        extra += ("--compile-cpu-limit", str(args.cpu_limit))
    with (
        GclmServer(max_batch=8, extra_args=extra, startup_timeout=args.startup_s) as server,
        httpx.Client(base_url=server.url, timeout=900) as client,
    ):
        t0 = time.monotonic()
        quiet = [one_schema(client, schema_body(small(f"q{i}")), t0) for i in range(args.quiet)]
        load = Load(server.url, args.streams, args.hogs_per_core * cores, args.load_s)
        try:
            time.sleep(3)  # the streams start decoding
            t0 = time.monotonic()
            loaded = [
                one_schema(client, schema_body(small(f"b{i}")), t0) for i in range(args.schemas)
            ]
            t0 = time.monotonic()
            results: dict[str, list[Answer]] = {}

            def bomb(name: str, body: dict[str, Any]) -> None:
                with httpx.Client(base_url=server.url, timeout=900) as c:
                    results[name] = attempts(c, body, args.attempts, t0)

            threads = [threading.Thread(target=bomb, args=item) for item in bombs().items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            streams = dict(load.statuses)
        finally:
            load.stop()
        counters = metrics(client)
    quiet_median = round(statistics.median(r["latency_s"] for r in quiet), 2)
    loaded_median = round(statistics.median(r["latency_s"] for r in loaded), 2)
    return {
        "settings": {
            "cores": cores,
            "schemas": args.schemas,
            "quiet": args.quiet,
            "streams": args.streams,
            "hogs": args.hogs_per_core * cores,
            "compile_timeout_s": args.compile_timeout,
            "compile_cpu_limit_s": args.cpu_limit or "default",
            "attempts": args.attempts,
        },
        "quiet_median_s": quiet_median,
        "loaded_median_s": loaded_median,
        "loaded_over_quiet": round(loaded_median / quiet_median, 2),
        "loaded_429s": sum(r["statuses"].count(429) for r in loaded),
        "loaded_200_first_try": sum(r["statuses"][0] == 200 for r in loaded),
        "loaded_200_at_retry": sum(r["statuses"][1:] == [200] for r in loaded),
        "stream_answers": streams,
        "quiet": quiet,
        "loaded": loaded,
        "bombs": {name: [asdict(a) for a in answers] for name, answers in results.items()},
        "metrics": counters,
    }


def markdown(r: dict[str, Any], command: str) -> str:
    s = r["settings"]
    lines = [
        "# Compiles under load (issue 22, scenarios b and d)",
        "",
        f"`{command}`: {s['cores']} cores, {s['streams']} decoding streams and {s['hogs']} "
        f"busy processes; compile timeout {s['compile_timeout_s']} s, CPU limit "
        f"{s['compile_cpu_limit_s']}. One run on a machine shared with other work: read the "
        "ratios.",
        "",
        "## (b) new small schemas, one by one",
        "",
        "| | quiet | loaded | ratio |",
        "|---|---|---|---|",
        f"| median latency (429 retry included) | {r['quiet_median_s']} s | "
        f"{r['loaded_median_s']} s | {r['loaded_over_quiet']}x |",
        "",
        f"Loaded: {r['loaded_200_first_try']} of {s['schemas']} answered 200 at the first try, "
        f"{r['loaded_200_at_retry']} at the retry their Retry-After asked for; "
        f"{r['loaded_429s']} answers were 429.",
        "",
        "## (d) compile bombs, each sent after the previous answer's Retry-After",
        "",
        "| bomb | " + " | ".join(f"attempt {i + 1}" for i in range(s["attempts"])) + " |",
        "|---|" + "---|" * s["attempts"],
    ]
    for name, answers in r["bombs"].items():
        cells = []
        for a in answers:
            retry = f", retry {a['retry_after']:g} s" if a["retry_after"] is not None else ""
            cells.append(
                f"{a['status']} {a['code'] or ''} in {a['seconds']} s (at {a['at_s']} s{retry})"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Decoding streams' answers by status: " + json.dumps(r["stream_answers"]),
        "",
        "Counters at the end: " + json.dumps(r["metrics"]),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compile_load", description=__doc__)
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--quiet", type=int, default=5)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--hogs-per-core", type=int, default=3)
    parser.add_argument("--load-s", type=float, default=1800, help="the load's time bound")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--compile-timeout", type=float, default=10.0)
    parser.add_argument("--cpu-limit", type=float, default=0, help="0: the server's default")
    parser.add_argument("--startup-s", type=float, default=600, help="wait for /health")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    result = run(args)
    command = "python -m bench.compile_load " + " ".join(argv or sys.argv[1:])
    print(markdown(result, command))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
