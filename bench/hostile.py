"""Hostile constraints beside normal ones: status, time, /health and RSS over minutes.

    python -m bench.hostile [--minutes M] [--baseline CHECKOUT/.venv/bin/python]
                            [--json PATH] [--url URL --pid PID]

Starts `gclm serve` (embedded model, CPU, the defaults users get) and, for `--minutes`,
sends the catalogue below round-robin (the attacks of issue 55 and more of their families:
counted repetitions that write out a million NFA states, long case-insensitive literals,
wide alternations, deep nesting, rule and `$ref` chains) beside a client that sends a new
small grammar or schema every second. Every 5 s it reads the server's RSS, its compile
workers' apart, and the table cache's bytes from /metrics; /health is polled every 0.1 s.
With `--baseline`, the same run against that checkout's server follows, and the summary
prints both. tests/server/test_e2e_hostile.py runs the catalogue once with assertions.

The figures to read: `statuses` (no 5xx), `slowest_s` against --compile-timeout + 5,
`health_max_s` (target under 1 s), `normal_max_s` (a small new constraint, target under
5 s), and `rss_mb` over time against the budgets (cache 512 MB) plus the model.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench._server import BaselineServer, GclmServer

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "go"}]


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 20, **extra}


def grammar(text: str) -> dict[str, Any]:
    return _chat(structured_outputs={"grammar": text})


def custom_tool(text: str) -> dict[str, Any]:
    fmt = {"type": "grammar", "grammar": {"syntax": "lark", "definition": text}}
    tool = {"type": "custom", "custom": {"name": "t", "format": fmt}}
    return _chat(tools=[tool], tool_choice="required")


def schema(value: Any) -> dict[str, Any]:
    return _chat(
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": value}}
    )


def _nested_items(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        value = {"type": "array", "items": value}
    return value


def _ref_chain(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _chain(n: int, terminal: bool = False) -> str:
    name = "T" if terminal else "r"
    lines = [f"start: {name}0"] + [f"{name}{i}: {name}{i + 1}" for i in range(n - 1)]
    return "\n".join(lines) + f'\n{name}{n - 1}: "x"'


# name -> the request's body (made when sent: some are megabytes).
ATTACKS: dict[str, Callable[[], dict[str, Any]]] = {
    "repeat_1000x1000": lambda: grammar('start: ("a"~1000)~1000'),
    "repeat_100x100x100": lambda: grammar('start: (("a"~100)~100)~100'),
    "repeat_class": lambda: grammar('start: ("a".."z"~1000)~900'),
    "alternation_250k": lambda: grammar("start: " + " | ".join(f'"w{i}"' for i in range(250_000))),
    "alternation_12k": lambda: grammar("start: " + " | ".join(f'"{i}"' for i in range(12_000))),
    "icase_literal_20k": lambda: custom_tool('start: "' + "ab" * 10_000 + '"i'),
    "icase_literal_90k": lambda: grammar('start: "' + "xyz" * 30_000 + '"i'),
    "rule_chain_10k": lambda: grammar(_chain(10_000)),
    "rule_chain_3k": lambda: grammar(_chain(3_000)),
    "terminal_chain_3k": lambda: grammar(_chain(3_000, terminal=True)),
    "groups_1000": lambda: grammar("start: " + "(" * 1000 + '"a"' + ")" * 1000),
    "custom_groups_300": lambda: custom_tool("start: " + "(" * 300 + '"a"' + ")" * 300),
    "regex_groups_5000": lambda: _chat(structured_outputs={"regex": "(" * 5000 + "a" + ")" * 5000}),
    "schema_items_400": lambda: schema(_nested_items(400)),
    "schema_ref_chain_3000": lambda: schema(_ref_chain(3000)),
    "regex_repeat_1m": lambda: _chat(structured_outputs={"regex": "(?:(?:a{1000}){1000})"}),
}


def normal(i: int) -> dict[str, Any]:
    """A small constraint no earlier request had: a grammar or a schema, by turns."""
    if i % 2:
        return grammar(f'start: "yes" | "no" | "n{i}"')
    return schema(
        {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
    )


def rss_mb(pid: int) -> tuple[float, float]:
    """The server's resident MB, and its descendants' (the compile workers) together."""

    def rss(p: int) -> float:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def children(p: int) -> list[int]:
        out: list[int] = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return out

    todo, rest = children(pid), 0.0
    while todo:
        p = todo.pop()
        rest += rss(p)
        todo += children(p)
    return rss(pid), rest


class HealthWatch:
    """Polls /health every 0.1 s in a thread; `max_s` is the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self.at: list[float] = []  # when each poll started (time.monotonic())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(timeout=30.0) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                self.at.append(time.monotonic())
                try:
                    client.get(f"{self.url}/health")
                except httpx.HTTPError:
                    pass
                self.times.append(time.perf_counter() - started)
                self._stop.wait(0.1)

    @property
    def max_s(self) -> float:
        return max(self.times, default=0.0)


def send(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[int, float, str]:
    """(status, seconds, error code or "") of one chat completion; status 0: no answer."""
    started = time.perf_counter()
    try:
        response = client.post(f"{url}/v1/chat/completions", json=body)
    except httpx.HTTPError as e:
        return 0, time.perf_counter() - started, type(e).__name__
    code = ""
    if response.status_code != 200:
        try:
            code = response.json()["error"].get("code") or ""
        except (ValueError, KeyError, TypeError):
            code = response.text[:80]
    return response.status_code, time.perf_counter() - started, code


def cache_bytes(client: httpx.Client, url: str) -> float:
    try:
        text = client.get(f"{url}/metrics").text
    except httpx.HTTPError:
        return -1.0
    for line in text.splitlines():
        if line.startswith("gclm_table_cache_bytes "):
            return float(line.split()[1])
    return -1.0


def soak(url: str, pid: int, minutes: float) -> dict[str, Any]:
    """The mix for `minutes` against a running server: its statuses, times and RSS."""
    deadline = time.monotonic() + minutes * 60
    attacks: list[dict[str, Any]] = []
    normals: list[dict[str, Any]] = []
    samples: list[dict[str, float]] = []
    started = time.monotonic()

    def hostile_client() -> None:
        with httpx.Client(timeout=120.0) as client:
            i = 0
            names = list(ATTACKS)
            while time.monotonic() < deadline:
                name = names[i % len(names)]
                sent = time.monotonic() - started
                status, seconds, code = send(client, url, ATTACKS[name]())
                attacks.append(
                    {"name": name, "t": sent, "status": status, "seconds": seconds, "code": code}
                )
                i += 1

    def normal_client() -> None:
        with httpx.Client(timeout=120.0) as client:
            i = 0
            while time.monotonic() < deadline:
                status, seconds, code = send(
                    client, url, normal(int(time.time() * 1000) * 2 + i % 2)
                )
                normals.append({"status": status, "seconds": seconds, "code": code})
                i += 1
                time.sleep(1.0)

    def sampler() -> None:
        with httpx.Client(timeout=30.0) as client:
            while time.monotonic() < deadline + 5:
                main, workers = rss_mb(pid)
                samples.append(
                    {
                        "t": time.monotonic() - started,
                        "rss_mb": main,
                        "workers_mb": workers,
                        "cache_mb": cache_bytes(client, url) / 2**20,
                    }
                )
                time.sleep(5.0)

    threads = [threading.Thread(target=f) for f in (hostile_client, normal_client, sampler)]
    with HealthWatch(url) as health:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    statuses: dict[str, int] = {}
    for row in attacks + normals:
        statuses[str(row["status"])] = statuses.get(str(row["status"]), 0) + 1
    normal_times = [r["seconds"] for r in normals if r["status"] == 200]
    return {
        "minutes": minutes,
        "statuses": statuses,
        "attacks": attacks,
        "normals": normals,
        "rss": samples,
        "health_max_s": health.max_s,
        # The slowest /health answers, and the attacks in flight when each was asked.
        "health_slowest": [
            {
                "t": t - started,
                "seconds": s,
                "during": [
                    a["name"] for a in attacks if a["t"] <= t - started <= a["t"] + a["seconds"]
                ],
            }
            for s, t in sorted(zip(health.times, health.at, strict=True), reverse=True)[:5]
        ],
        "health_p50_s": statistics.median(health.times) if health.times else None,
        "slowest_s": max((r["seconds"] for r in attacks), default=0.0),
        "normal_p50_s": statistics.median(normal_times) if normal_times else None,
        "normal_max_s": max(normal_times, default=None),
        "rss_start_mb": samples[0]["rss_mb"] if samples else None,
        "rss_max_mb": max((s["rss_mb"] for s in samples), default=None),
        "rss_end_mb": samples[-1]["rss_mb"] if samples else None,
    }


def summary(name: str, run: dict[str, Any]) -> str:
    return (
        f"{name}: statuses {run['statuses']}, slowest {run['slowest_s']:.1f} s, /health max "
        f"{run['health_max_s']:.2f} s, new small constraint p50 {run['normal_p50_s'] or 0:.2f} s "
        f"max {run['normal_max_s'] or 0:.2f} s, RSS {run['rss_start_mb']:.0f} -> max "
        f"{run['rss_max_mb']:.0f} -> {run['rss_end_mb']:.0f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--baseline", help="another checkout's .venv/bin/python, run after")
    parser.add_argument("--url", help="a running server instead (with --pid)")
    parser.add_argument("--pid", type=int, help="the running server's process id")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"machine": platform.machine(), "python": sys.version.split()[0]}
    if args.url:
        if args.pid is None:
            parser.error("--url needs --pid (the server's RSS is read from /proc)")
        out["gclm"] = soak(args.url.rstrip("/"), args.pid, args.minutes)
    else:
        with GclmServer(max_batch=None) as server:
            assert server.process is not None
            out["gclm"] = soak(server.url, server.process.pid, args.minutes)
        if args.baseline:
            with BaselineServer(max_batch=None, python=args.baseline) as server:
                assert server.process is not None
                out["baseline"] = soak(server.url, server.process.pid, args.minutes)
    for name in ("gclm", "baseline"):
        if name in out:
            print(summary(name, out[name]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
