"""Prometheus metrics for /metrics, in a registry of the app's own.

Counted by the HTTP layer: requests by endpoint and status, prompt and completion tokens,
rejections by reason, client disconnects, compile time. Read from `engine.stats()` at each
scrape: queue depth and wait, batch size, free KV slots, prefill tokens and steps (rates
divided give the prefill tokens and the time per step), compile-cache hits and misses, the
table cache's memory and disk use against their budgets, the compile pool's queue and
processes, and any other number the engine reports (as `gclm_engine_<name>`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gclm.server.engine.protocol import Engine

logger = logging.getLogger("gclm.server")

# Compile times run from a cache hit (microseconds) to a large schema (tens of seconds).
COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# engine.stats() key -> (metric name, help, is a counter)
_KNOWN_STATS = {
    "queue_depth": ("gclm_queue_depth", "Choices waiting for a batch slot.", False),
    "batch_size": ("gclm_batch_size", "Choices in the running batch.", False),
    "kv_slots_free": (
        "gclm_kv_slots_free",
        "KV slots no sequence holds or was promised (after the last step).",
        False,
    ),
    "queue_oldest_wait_seconds": (
        "gclm_queue_oldest_wait_seconds",
        "Seconds the oldest waiting choice has waited for a KV slot.",
        False,
    ),
    "queue_wait_seconds": (
        "gclm_queue_wait_seconds",
        "Seconds admitted choices waited for a KV slot, summed (over gclm_admitted: the mean).",
        True,
    ),
    "admitted": ("gclm_admitted", "Choices given a KV slot.", True),
    "queue_full_rejections": (
        "gclm_queue_full_rejections",
        "Choices refused because the queue past the free KV slots was full.",
        True,
    ),
    "prefilling": (
        "gclm_prefilling",
        "Prompts being prefilled (a chunk per step, or on the prefill thread).",
        False,
    ),
    "prefill_tokens": (
        "gclm_prefill_tokens",
        "Prompt tokens prefilled (all chunks, the prefill thread's too).",
        True,
    ),
    "prefill_chunks": ("gclm_prefill_chunks", "Prompt chunks prefilled by engine steps.", True),
    "side_prefills": (
        "gclm_side_prefills",
        "Prompts prefilled on the prefill thread beside the steps (--prefill-thread).",
        True,
    ),
    "side_prefill_tokens": (
        "gclm_side_prefill_tokens",
        "Prompt tokens prefilled on the prefill thread.",
        True,
    ),
    "side_prefill_seconds": (
        "gclm_side_prefill_seconds",
        "Seconds from a prompt's start on the prefill thread to its first token's step.",
        True,
    ),
    "packed_passes": (
        "gclm_engine_packed_passes",
        "Forward passes that packed decoding rows and prompt chunks into one row.",
        True,
    ),
    "steps": ("gclm_engine_steps", "Engine steps (a decode and a prompt chunk each).", True),
    "step_seconds": (
        "gclm_engine_step_seconds",
        "Seconds spent in engine steps (over gclm_engine_steps: the time per step).",
        True,
    ),
    "last_step_seconds": ("gclm_last_step_seconds", "Seconds the last engine step took.", False),
    "last_step_prefill_tokens": (
        "gclm_last_step_prefill_tokens",
        "Prompt tokens the last engine step prefilled.",
        False,
    ),
    "max_batched_tokens": (
        "gclm_max_batched_tokens",
        "Positions one engine step may compute (--max-num-batched-tokens).",
        False,
    ),
    "cache_hits": ("gclm_compile_cache_hits", "Constraint compilations served from cache.", True),
    "cache_misses": ("gclm_compile_cache_misses", "Constraint compilations run.", True),
    "table_cache_bytes": (
        "gclm_table_cache_bytes",
        "Bytes cached in memory per schema: tables, mask rows, failures.",
        False,
    ),
    "table_cache_budget_bytes": (
        "gclm_table_cache_budget_bytes",
        "The in-memory table cache's budget (--cache-memory).",
        False,
    ),
    "table_cache_entries": ("gclm_table_cache_entries", "Tables cached in memory.", False),
    "table_cache_negative_entries": (
        "gclm_table_cache_negative_entries",
        "Compile failures remembered in memory.",
        False,
    ),
    "table_cache_evictions": (
        "gclm_table_cache_evictions",
        "Entries evicted from the in-memory table cache.",
        True,
    ),
    "table_disk_bytes": ("gclm_table_disk_bytes", "Bytes of compiled tables on disk.", False),
    "table_disk_budget_bytes": (
        "gclm_table_disk_budget_bytes",
        "The disk table cache's cap (--cache-disk).",
        False,
    ),
    "table_disk_files": ("gclm_table_disk_files", "Compiled tables on disk.", False),
    "table_disk_evictions": (
        "gclm_table_disk_evictions",
        "Files evicted from the disk table cache.",
        True,
    ),
    "compile_queue_depth": (
        "gclm_compile_queue_depth",
        "Compiles waiting for a worker process.",
        False,
    ),
    "compiles_running": ("gclm_compiles_running", "Compiles running in workers.", False),
    "compiles_demoted": (
        "gclm_compiles_demoted",
        "Slow compiles running at a lower CPU priority.",
        False,
    ),
    "compiles_background": (
        "gclm_compiles_background",
        "Compiles going on after their request's deadline (429), for the cache.",
        False,
    ),
    "compiles_sent_to_background": (
        "gclm_compiles_sent_to_background",
        "Compiles that went on after their request's deadline.",
        True,
    ),
    "compile_cpu_seconds": (
        "gclm_compile_cpu_seconds",
        "CPU seconds used by ended compiles in the worker processes.",
        True,
    ),
    "compiles_started": (
        "gclm_compiles_started",
        "Compiles handed to a worker process.",
        True,
    ),
    "first_compiles_started": (
        "gclm_first_compiles_started",
        "Of those, compiles of a byte DFA alone, for first masks (--first-mask lazy).",
        True,
    ),
    "first_masks_grown": (
        "gclm_first_masks_grown",
        "New constraints whose first masks came from a byte DFA grown from the regex's NFA in "
        "the server's process, instead of a FIRST compile (--first-mask lazy).",
        True,
    ),
    "first_mask_grow_seconds": (
        "gclm_first_mask_grow_seconds",
        "Seconds those NFAs took to build, in all.",
        True,
    ),
    "compile_queue_seconds": (
        "gclm_compile_queue_seconds",
        "Seconds compiles waited for a worker process before they started, in all.",
        True,
    ),
    "compiles_cpu_limited": (
        "gclm_compiles_cpu_limited",
        "Compiles stopped at the CPU ceiling (--compile-cpu-limit), then remembered.",
        True,
    ),
    "compiles_shed": (
        "gclm_compiles_shed",
        "Compiles no request waited for, stopped because together they held too much memory.",
        True,
    ),
    "compiles_abandoned": (
        "gclm_compiles_abandoned",
        "Compiles stopped because every request that asked for them left before they ended.",
        True,
    ),
    "compile_processes": ("gclm_compile_processes", "Live compile worker processes.", False),
    "compile_workers_idle": (
        "gclm_compile_workers_idle",
        "Warm compile workers with nothing to do.",
        False,
    ),
}
_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class EngineCollector(Collector):
    """Turns `engine.stats()` into gauges and counters at scrape time."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        try:
            stats: dict[str, Any] = self.engine.stats().as_dict()
        except Exception:  # a scrape must not fail because the engine is busy or broken
            logger.exception("engine.stats() failed")
            return
        for key in _KNOWN_STATS:
            stats.setdefault(key, 0.0)  # always exported, so dashboards see zeros
        for key, value in sorted(stats.items()):
            if not isinstance(value, int | float):
                continue
            name, doc, is_counter = _KNOWN_STATS.get(
                key, (f"gclm_engine_{key}", f"engine.stats()[{key!r}].", False)
            )
            if not _METRIC_NAME.fullmatch(name):
                continue
            family = CounterMetricFamily if is_counter else GaugeMetricFamily
            yield family(name, doc, value=float(value))


class Metrics:
    """The app's metrics; one instance per app, so tests can build many apps."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gclm_requests",
            "HTTP requests by endpoint and status code.",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "gclm_prompt_tokens", "Prompt tokens of admitted requests.", registry=self.registry
        )
        self.completion_tokens = Counter(
            "gclm_completion_tokens", "Generated tokens.", registry=self.registry
        )
        self.rejections = Counter(
            "gclm_rejections",
            "Requests answered with an error, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.key_requests = Counter(
            "gclm_key_requests",
            "HTTP requests by API key name and status code.",
            ["key", "status"],
            registry=self.registry,
        )
        self.key_tokens = Counter(
            "gclm_key_tokens",
            "Prompt and completion tokens of finished requests, by API key name.",
            ["key"],
            registry=self.registry,
        )
        self.key_compile_seconds = Counter(
            "gclm_key_compile_seconds",
            "Seconds of compiling the requests of each API key caused (cached tables: none).",
            ["key"],
            registry=self.registry,
        )
        self.disconnects = Counter(
            "gclm_client_disconnects",
            "Requests whose client left before the response was complete.",
            registry=self.registry,
        )
        self.first_masks = Counter(
            "gclm_first_mask_requests",
            "Requests that started on first masks (a LazyTable) while their constraint compiled.",
            registry=self.registry,
        )
        self.compile_seconds = Histogram(
            "gclm_compile_seconds",
            (
                "Time a constrained request waited for its constraint: the compile (or cache"
                " fetch) of its first masks or table, and its budget check; once a request."
            ),
            buckets=COMPILE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(EngineCollector(engine))

    def reject(self, reason: str) -> None:
        self.rejections.labels(reason=reason).inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class RequestCounter:
    """ASGI middleware counting requests by endpoint and final status.

    Pure ASGI rather than BaseHTTPMiddleware, which would wrap `receive` and hide client
    disconnects from the streaming responses.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, endpoints: frozenset[str]) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoints = endpoints  # known paths; anything else is "other", to bound labels

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app fails before starting a response

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            path = scope["path"]
            endpoint = path if path in self.endpoints else "other"
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
