"""Soak: memory under many distinct schemas, and cached-request latency under compile bombs.

    python -m bench.soak [--schemas N] [--cache-memory MIB] [--cache-disk MIB]
                         [--bombs N] [--json PATH] [--md PATH]

Starts `gclm serve` (embedded model, CPU) with the given cache budgets and runs:

    (1) idle        latency of a request whose schema is cached (median of 5), and the
                    latency of a request for a new small schema (its compile included)
    (2) bombs       the same two while N distinct schemas that each run into the compile
                    timeout are in flight (e.g. {"type":"number","minimum":-1e20,
                    "maximum":1.1e20}); ratios against (1)
    (3) soak        N distinct schemas, each compiled and then refused with a 400
                    (max_tokens=1 is below its minimum), as the probe did; every 5% the
                    server's RSS (its main process, and its compile workers apart), the
                    table cache's bytes from /metrics and the disk cache's size

The figures to read: cached_under_bombs_ratio (target <= 2), new_schema_extra_s (target
<= 1 s over its idle time), and rss_growth_mb against the memory budget (target: growth
<= budget x 1.15, flat once the cap is reached), disk_mb against its cap.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench._server import GclmServer

SMALL = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["answer"],
}
MESSAGES = [{"role": "user", "content": "Answer yes or no: is the sky blue?"}]


def bomb(i: int) -> dict[str, Any]:
    """A 55-byte schema whose DFA does not finish within the compile timeout."""
    return {"type": "number", "minimum": -1e20, "maximum": (11 + i) * 1e19}


def distinct(i: int) -> dict[str, Any]:
    """A schema that no other `i` shares (its property name and bound differ), whose table
    and mask rows hold ~0.9 MB in memory at this vocabulary."""
    return {
        "type": "object",
        "properties": {
            f"x_{i}": {"type": "number", "minimum": -1000.5, "maximum": 100000.25 + i},
            "y": {"type": "string", "pattern": "^[a-z]{2,12}$"},
        },
        "required": [f"x_{i}", "y"],
    }


def fresh_small(tag: str) -> dict[str, Any]:
    return {**SMALL, "properties": {f"answer_{tag}": SMALL["properties"]["answer"]}}


def chat(client: httpx.Client, schema: dict[str, Any], max_tokens: int = 16) -> tuple[float, int]:
    started = time.perf_counter()
    response = client.post(
        "/v1/chat/completions",
        json={
            "messages": MESSAGES,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema},
            },
            "max_tokens": max_tokens,
            "temperature": 0,
        },
    )
    return time.perf_counter() - started, response.status_code


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children_rss_mb(pid: int) -> float:
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            total += rss_mb(int(entry.name))
    return total


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def disk_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in directory.glob("*.npz")) / 2**20


def latencies(client: httpx.Client, schema: dict[str, Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        seconds, status = chat(client, schema)
        assert status == 200, status
        out.append(seconds)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    extra = (
        "--cache-memory", str(args.cache_memory),
        "--cache-disk", str(args.cache_disk),
        "--compile-timeout", str(args.compile_timeout),
    )  # fmt: skip
    with GclmServer(max_batch=8, extra_args=extra) as server:
        pid = server.process.pid  # type: ignore[union-attr]
        boot_rss = rss_mb(pid)  # serving, nothing requested yet
        tables = server.workdir / "cache" / "tables"
        client = httpx.Client(base_url=server.url, timeout=300.0)
        load_before = os.getloadavg()[0]

        # (1) idle
        latencies(client, SMALL, 2)  # compile and warm up
        # Idle figures are taken before and after the bombs: the machine is noisy.
        idle_cached_runs = latencies(client, SMALL, 5)
        idle_new_runs = [chat(client, fresh_small(f"idle{i}"))[0] for i in range(3)]

        # (2) bombs in flight
        statuses: list[int] = []
        bomb_seconds: list[float] = []

        def send_bomb(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=300.0) as c:
                seconds, status = chat(c, bomb(i))
                statuses.append(status)
                bomb_seconds.append(seconds)

        threads = [threading.Thread(target=send_bomb, args=(i,)) for i in range(args.bombs)]
        for t in threads:
            t.start()
        time.sleep(args.bomb_settle)  # the bombs are demoted; fresh workers warm up
        busy_cached = statistics.median(latencies(client, SMALL, 5))
        busy_new = statistics.median([chat(client, fresh_small(f"busy{i}"))[0] for i in range(3)])
        for t in threads:
            t.join()
        bombs_done = max(bomb_seconds)
        idle_cached_runs += latencies(client, SMALL, 5)
        idle_new_runs += [chat(client, fresh_small(f"after{i}"))[0] for i in range(3)]
        idle_cached = statistics.median(idle_cached_runs)
        idle_new = statistics.median(idle_new_runs)
        print(f"idle: cached {idle_cached:.3f} s, new small schema {idle_new:.3f} s", flush=True)
        print(
            f"{args.bombs} bombs: cached {busy_cached:.3f} s "
            f"({busy_cached / idle_cached:.2f}x idle), new small schema {busy_new:.3f} s "
            f"(+{busy_new - idle_new:.2f} s); each bomb answered {sorted(statuses)} "
            f"within {bombs_done:.1f} s of its request",
            flush=True,
        )

        # (3) distinct-schema soak
        start_rss = rss_mb(pid)
        samples = []
        every = max(1, args.schemas // 20)
        soak_started = time.perf_counter()
        refused = 0
        for i in range(args.schemas):
            _, status = chat(client, distinct(i), max_tokens=1)
            refused += status == 400
            if (i + 1) % every == 0 or i + 1 == args.schemas:
                sample = {
                    "schemas": i + 1,
                    "seconds": round(time.perf_counter() - soak_started, 1),
                    "rss_mb": round(rss_mb(pid), 1),
                    "workers_rss_mb": round(children_rss_mb(pid), 1),
                    "cache_mb": round(metric(client, "gclm_table_cache_bytes") / 2**20, 1),
                    "disk_mb": round(disk_mb(tables), 1),
                }
                samples.append(sample)
                print(
                    "  {schemas:5d} schemas {seconds:7.1f} s  rss {rss_mb:7.1f} MB  "
                    "workers {workers_rss_mb:7.1f} MB  cache {cache_mb:6.1f} MB  "
                    "disk {disk_mb:6.1f} MB".format(**sample),
                    flush=True,
                )
        client.close()
        log = server.log_path.read_text(errors="replace")

    peak = max(s["rss_mb"] for s in samples)
    growth = peak - start_rss
    second_half = [s["rss_mb"] for s in samples[len(samples) // 2 :]]
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
        },
        "settings": {
            "cache_memory_mib": args.cache_memory,
            "cache_disk_mib": args.cache_disk,
            "compile_timeout_s": args.compile_timeout,
            "bombs": args.bombs,
            "schemas": args.schemas,
        },
        "idle_cached_s": round(idle_cached, 3),
        "bombs_cached_s": round(busy_cached, 3),
        "cached_under_bombs_ratio": round(busy_cached / idle_cached, 2),
        "idle_new_schema_s": round(idle_new, 3),
        "bombs_new_schema_s": round(busy_new, 3),
        "new_schema_extra_s": round(busy_new - idle_new, 3),
        "bomb_statuses": sorted(statuses),
        "bombs_answered_within_s": round(bombs_done, 1),
        "soak_refused_400": refused,
        "boot_rss_mb": round(boot_rss, 1),
        "boot_growth_over_budget": round((peak - boot_rss) / args.cache_memory, 3),
        "start_rss_mb": round(start_rss, 1),
        "peak_rss_mb": round(peak, 1),
        "rss_growth_mb": round(growth, 1),
        "rss_growth_over_budget": round(growth / args.cache_memory, 3),
        "rss_second_half_spread_mb": round(max(second_half) - min(second_half), 1),
        "final_disk_mb": samples[-1]["disk_mb"],
        "samples": samples,
        "server_tracebacks": log.count("Traceback"),
    }
    return result


def markdown(r: dict[str, Any], command: str) -> str:
    s = r["settings"]
    lines = [
        "# Soak: distinct schemas and compile bombs",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {r['machine']['cpus']} CPUs, load {r['machine']['load_before']} before, "
        f"{r['machine']['load_after']} after. Budgets: --cache-memory {s['cache_memory_mib']} "
        f"MiB, --cache-disk {s['cache_disk_mib']} MiB, --compile-timeout "
        f"{s['compile_timeout_s']} s.",
        "",
        "| figure | idle | with bombs in flight | ratio / extra |",
        "|---|---|---|---|",
        "| cached schema, request latency (median of 10 idle, 5 with bombs) | "
        f"{r['idle_cached_s']} s | "
        f"{r['bombs_cached_s']} s | {r['cached_under_bombs_ratio']}x |",
        "| new small schema, request latency (median of 6 idle, 3 with bombs) | "
        f"{r['idle_new_schema_s']} s | "
        f"{r['bombs_new_schema_s']} s | +{r['new_schema_extra_s']} s |",
        "",
        f"{s['bombs']} bombs answered {r['bomb_statuses']}, each within "
        f"{r['bombs_answered_within_s']} s of its request.",
        "",
        f"Soak: {s['schemas']} distinct schemas, {r['soak_refused_400']} refused with 400 "
        f"(max_tokens=1). Server RSS {r['boot_rss_mb']} MB when it began serving "
        f"(peak - that = {r['boot_growth_over_budget']}x the memory budget), "
        f"{r['start_rss_mb']} MB when the soak began (after the latency phases), peak "
        f"{r['peak_rss_mb']} MB: growth {r['rss_growth_mb']} MB = "
        f"{r['rss_growth_over_budget']}x the memory budget; spread over the second half "
        f"{r['rss_second_half_spread_mb']} MB. Disk cache {r['final_disk_mb']} MB "
        f"(cap {s['cache_disk_mib']} MiB). Tracebacks in the server log: "
        f"{r['server_tracebacks']}.",
        "",
        "| schemas | s | server RSS MB | compile workers RSS MB | table cache MB | disk MB |",
        "|---|---|---|---|---|---|",
    ]
    for x in r["samples"]:
        lines.append(
            f"| {x['schemas']} | {x['seconds']} | {x['rss_mb']} | {x['workers_rss_mb']} | "
            f"{x['cache_mb']} | {x['disk_mb']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--schemas", type=int, default=3000)
    parser.add_argument("--cache-memory", type=int, default=512, help="MiB")
    parser.add_argument("--cache-disk", type=int, default=256, help="MiB")
    parser.add_argument("--compile-timeout", type=float, default=10.0)
    parser.add_argument("--bombs", type=int, default=6)
    parser.add_argument("--bomb-settle", type=float, default=4.0, help="seconds")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    result = run(args)
    command = "python -m bench.soak " + " ".join(argv or sys.argv[1:])
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
