"""Compile time and coverage over a schema set: outlines-core's Index alone against ours.

    python -m bench.compile [--json PATH] [--schemas DIR_OR_GLOB ...] [--timeout S]
                            [--limit N] [--workers W] [--split N]

Per schema, in one worker process with the compile time limit (default 10 s, as the server):

    (a) outlines-core alone: `outlines_core.Index(regex, vocab.outlines)` on the regex our
        to_regex gives (normalised schema; building that regex is not timed in (a));
    (b) ours end to end: compile_constraint (regex, Index, read, tables);
    (c) a cache hit: TableCache.get on the constraint (b) compiled, median of 5 hits.

(a) and (b) alternate in order from one schema to the next, after a warm-up compile, so
that neither is charged the first build or a colder cache. A schema whose (a) and (b) do not
finish together within the limit fails as "timeout"; the worker is killed and replaced.

Coverage is compiled/total. Table memory is set against the GCLM seed's dense S x V int64
tensor (S live states, V the vocabulary). --split re-runs the N slowest compiles phase by
phase (regex, Index, __reduce__, the numba pass, dropping the Index, finish_table, shortest
output) to show where (b) - (a) goes. With --json PATH a markdown summary is written
next to it (PATH with .md).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import multiprocessing as mp
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.jsonschemabench import DEFAULT_DIR, subset_of
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.worker import CompileLimits
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.tables import CompiledTable
from gclm.errors import ConstraintError, GclmError

DEFAULT_SCHEMAS = DEFAULT_DIR
CACHE_HITS = 5
START_TIMEOUT_S = 300.0  # spawning a worker: imports, the vocabulary, the warm-up compile
WARM_UP = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}


# --- worker process ---------------------------------------------------------------------


def _serve(conn: Any, vocab: TokenVocabulary, limits: CompileLimits) -> None:
    """Worker loop: receive (kind, schema, a_first), send ("part", {...}) after each step,
    then ("done", {...})."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    except (ImportError, ValueError, OSError):
        pass
    _warm_up(vocab, limits)
    conn.send(("ready", {}))
    while True:
        try:
            kind, schema, a_first = conn.recv()
        except EOFError:
            return
        try:
            constraint = Constraint.json_schema(schema)
        except GclmError as e:
            conn.send(("done", {"b_error": _error(e, "b")}))
            continue
        if kind == "split":
            conn.send(("done", _guarded(lambda c=constraint: split_phases(c, vocab), "split")))
            continue
        steps = [("a", index_only), ("b", full_compile)]
        table = None
        for step, fn in steps if a_first else steps[::-1]:
            part = _guarded(lambda fn=fn, c=constraint: fn(c, vocab, limits), step)
            table = part.pop("table", table)
            conn.send(("part", part))
        extra = _guarded(lambda t=table: runtime_memory(t), "m") if table is not None else {}
        conn.send(("done", extra))


def _guarded(fn: Any, step: str) -> dict[str, Any]:
    try:
        return fn()
    except GclmError as e:
        return {f"{step}_error": _error(e, step)}
    except MemoryError:
        return {
            f"{step}_error": {
                "step": step,
                "type": "MemoryError",
                "code": "compile_limit",
                "message": "memory limit",
            }
        }
    except Exception as e:  # an outlines-core or gclm bug: record it, keep measuring
        return {f"{step}_error": _error(e, step)}


def _error(e: Exception, step: str) -> dict[str, Any]:
    return {
        "step": step,
        "type": type(e).__name__,
        "code": getattr(e, "code", None),
        "keyword": getattr(e, "keyword", None),
        "message": getattr(e, "message", None) or repr(e),
    }


def _warm_up(vocab: TokenVocabulary, limits: CompileLimits) -> None:
    """Load numba's compiled reader, build the outlines Vocabulary and the fingerprint."""
    constraint = Constraint.json_schema(WARM_UP)
    for step in ("a", "b", "split"):
        if step == "split":
            _guarded(lambda: split_phases(constraint, vocab), step)
        else:
            fn = index_only if step == "a" else full_compile
            _guarded(lambda fn=fn: fn(constraint, vocab, limits), step)


def index_only(
    constraint: Constraint, vocab: TokenVocabulary, limits: CompileLimits
) -> dict[str, Any]:
    """(a): time outlines_core.Index alone on our regex."""
    import outlines_core

    from gclm.compiler.front.regex import to_regex

    started = time.perf_counter()
    regex = to_regex(constraint)
    regex_s = time.perf_counter() - started
    started = time.perf_counter()
    try:
        index = outlines_core.Index(regex.regex, vocab.outlines)
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"The constraint could not be compiled: {e}") from e
    a_s = time.perf_counter() - started
    del index
    return {"a_s": a_s, "regex_s": regex_s, "regex_chars": len(regex.regex)}


def full_compile(
    constraint: Constraint, vocab: TokenVocabulary, limits: CompileLimits
) -> dict[str, Any]:
    """(b) compile_constraint end to end, then (c) cache hits on its table."""
    from gclm.compiler.service.cache import TableCache
    from gclm.compiler.whole.compile import compile_constraint

    started = time.perf_counter()
    table = compile_constraint(constraint, vocab, max_states=limits.max_states)
    b_s = time.perf_counter() - started
    cache = TableCache(lambda _: table, vocab.fingerprint)
    cache.get(constraint)  # the miss: compile_fn hands back the table (b) built
    hits = []
    for _ in range(CACHE_HITS):
        started = time.perf_counter()
        cache.get(constraint)
        hits.append(time.perf_counter() - started)
    dense = table.num_states * vocab.size * 8
    all_packed = table.nbytes - table.token_sets.nbytes + table.token_sets.packed_nbytes
    return {
        "b_s": b_s,
        "c_s": statistics.median(hits),
        "states": table.num_states,
        "groups": table.num_groups,
        "token_sets": len(table.token_sets),
        "table_bytes": table.nbytes,
        "dense_bytes": dense,
        "table_pct_of_dense": 100.0 * table.nbytes / dense,
        "all_packed_pct_of_dense": 100.0 * all_packed / dense,
        "rewrites": len(table.rewrites),
        "table": table,  # for runtime_memory; not sent back
    }


def runtime_memory(table: CompiledTable) -> dict[str, Any]:
    """Untimed, after (a) and (b): the engine's mask rows for the table (forward rows, group
    tests, and the tight rows a table this size gets up front)."""
    from gclm.masking.masks import MaskTable

    runtime = MaskTable(table).nbytes
    dense = table.num_states * table.vocab_size * 8
    return {"runtime_bytes": runtime, "runtime_pct_of_dense": 100.0 * runtime / dense}


def split_phases(constraint: Constraint, vocab: TokenVocabulary) -> dict[str, Any]:
    """compile_constraint's steps, timed one by one."""
    import outlines_core

    from bench.outlines_index import parse_index_bytes
    from gclm.compiler.front.regex import to_regex
    from gclm.compiler.whole.compile import table_from_grouped
    from gclm.compiler.whole.tables import with_shortest_output

    t, out = time.perf_counter(), {}

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[f"{name}_s"], t = now - t, now

    regex = to_regex(constraint)
    lap("regex")
    index = outlines_core.Index(regex.regex, vocab.outlines)
    lap("index")
    _, (blob,) = index.__reduce__()
    lap("reduce")
    grouped = parse_index_bytes(blob, vocab.size, vocab.eos_token_id)
    lap("parse")
    del index
    lap("drop_index")
    table = table_from_grouped(grouped, vocab)
    lap("finish")
    table = with_shortest_output(table, vocab.token_bytes)
    lap("shortest")
    out.update(blob_bytes=len(blob), states=table.num_states, groups=table.num_groups)
    return out


# --- parent: one worker per thread ------------------------------------------------------


class BenchWorker:
    """A spawned worker process and its pipe; replaced after a timeout or a crash."""

    def __init__(self, vocab: TokenVocabulary, limits: CompileLimits):
        self.vocab, self.limits = vocab, limits
        self.runs = 0  # alternates (a)-first and (b)-first within this process
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve, args=(child, self.vocab, self.limits), daemon=True
        )
        self.process.start()
        child.close()
        if not self.conn.poll(START_TIMEOUT_S):
            raise RuntimeError("the benchmark worker did not start in time")
        self.conn.recv()

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()

    def measure(self, kind: str, schema: Any) -> dict[str, Any]:
        """Run one job under the time limit; partial results survive a timeout."""
        a_first = self.runs % 2 == 0
        self.runs += 1
        row: dict[str, Any] = {"a_first": a_first} if kind == "time" else {}
        self.conn.send((kind, schema, a_first))
        deadline = time.monotonic() + self.limits.timeout_s
        parts = 0
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0 or not self.conn.poll(left):
                    if parts == 2:  # (a) and (b) are in; only the untimed extra ran over
                        self.restart()
                        return row
                    fail = {
                        "step": "timeout",
                        "type": "timeout",
                        "code": "compile_limit",
                        "message": f"(a)+(b) not done in {self.limits.timeout_s:g} s",
                    }
                    self.restart()
                    return {**row, "error": fail}
                tag, part = self.conn.recv()
            except (EOFError, OSError):
                self.restart()
                return {
                    **row,
                    "error": {
                        "step": "crash",
                        "type": "WorkerDied",
                        "code": "compile_limit",
                        "message": "the worker died (memory limit?)",
                    },
                }
            row.update(part)
            if tag == "done":
                return row
            parts += 1
            if parts == 2:  # the untimed extra gets a window of its own
                deadline = time.monotonic() + self.limits.timeout_s


def run_all(
    jobs: list[tuple[str, Any]],
    kind: str,
    vocab: TokenVocabulary,
    limits: CompileLimits,
    workers: int,
    log: Any = None,
) -> list[dict[str, Any]]:
    """Measure every (name, schema) job; rows come back in job order."""
    rows: list[dict[str, Any] | None] = [None] * len(jobs)
    lock, next_job = threading.Lock(), iter(range(len(jobs)))

    def loop() -> None:
        worker = BenchWorker(vocab, limits)
        try:
            while True:
                with lock:
                    i = next(next_job, None)
                if i is None:
                    return
                name, schema = jobs[i]
                row = finalise(
                    {"file": name, "subset": subset_of(name), **worker.measure(kind, schema)}
                )
                rows[i] = row
                if log:
                    with lock:
                        log(i, len(jobs), row)
        finally:
            worker.close()

    threads = [threading.Thread(target=loop) for _ in range(min(workers, len(jobs)))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return [r for r in rows if r is not None]


def finalise(row: dict[str, Any]) -> dict[str, Any]:
    """Decide ok/failure: a schema compiles when (a) and (b) both finished without error."""
    error = row.get("error") or row.get("b_error") or row.get("a_error") or row.get("split_error")
    row["ok"] = error is None and ("b_s" in row or "index_s" in row)
    row["error"] = error
    row["reason"] = None if error is None else failure_reason(error)
    if row.get("a_s") and row.get("b_s"):
        row["ratio"] = row["b_s"] / row["a_s"]
    return row


def failure_reason(error: dict[str, Any]) -> str:
    """A group key: error type plus its message with names, numbers and pointers taken out."""
    if error["type"] in ("timeout", "WorkerDied", "MemoryError"):
        return {"timeout": "timeout", "WorkerDied": "worker died", "MemoryError": "memory limit"}[
            error["type"]
        ]
    message = error["message"]
    if error.get("keyword"):
        detail = message.partition(" is not supported")[2].removeprefix(": ")
        detail = detail.removesuffix(". Remove it or rewrite the schema without it.")
        head = f"unsupported keyword {error['keyword']!r}"
        return f"{head}: {_normalise(detail)}" if detail else head
    return f"{error['type']}: {_normalise(message)}"


def _normalise(text: str, width: int = 70) -> str:
    text = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "'…'", text)
    text = re.sub(r"\s\(.*", "", text)  # parenthesised parser messages and the like
    text = re.sub(r" at /\S*", " at <ptr>", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# --- summary and reports ----------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"]]
    a, b, c = ([r[k] for r in ok] for k in ("a_s", "b_s", "c_s"))
    pct = [r["table_pct_of_dense"] for r in ok]
    runtime = [r["runtime_pct_of_dense"] for r in ok if "runtime_pct_of_dense" in r]
    summary: dict[str, Any] = {
        "total": len(rows),
        "compiled": len(ok),
        "coverage": len(ok) / len(rows) if rows else None,
        # Median over schemas of b/a; and median(b)/median(a) over the same schemas.
        "overhead_ratio_p50": _pct([r["ratio"] for r in ok], 50),
        "overhead_ratio_p90": _pct([r["ratio"] for r in ok], 90),
        "overhead_ratio_of_medians": (_pct(b, 50) / _pct(a, 50)) if ok else None,
        "table_pct_of_dense_p50": _pct(pct, 50),
        "table_pct_of_dense_p90": _pct(pct, 90),
        "table_pct_of_dense_max": max(pct) if pct else None,
        "table_over_2pct_of_dense": sum(p > 2 for p in pct),
        "all_packed_pct_of_dense_p50": _pct([r["all_packed_pct_of_dense"] for r in ok], 50),
        "all_packed_over_2pct_of_dense": sum(r["all_packed_pct_of_dense"] > 2 for r in ok),
        "runtime_pct_of_dense_p50": _pct(runtime, 50),
        "runtime_pct_of_dense_p90": _pct(runtime, 90),
        "runtime_pct_of_dense_max": max(runtime, default=None),
        "states_p50": _pct([r["states"] for r in ok], 50),
        "states_max": max((r["states"] for r in ok), default=None),
        "regex_s_p50": _pct([r["regex_s"] for r in ok], 50),
        "regex_s_p90": _pct([r["regex_s"] for r in ok], 90),
    }
    for key, values in (("a", a), ("b", b), ("c", c)):
        summary[f"{key}_s_p50"], summary[f"{key}_s_p90"] = _pct(values, 50), _pct(values, 90)
    summary["sum_a_s"], summary["sum_b_s"] = float(sum(a)), float(sum(b))
    return summary


def group_failures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[str, list[str]] = {}
    for r in rows:
        if not r["ok"]:
            groups.setdefault(r["reason"], []).append(r["file"])
    return [
        {"reason": reason, "count": len(files), "examples": files[:3]}
        for reason, files in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    ]


def by_subset(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        s = out.setdefault(r["subset"], {"total": 0, "compiled": 0})
        s["total"] += 1
        s["compiled"] += r["ok"]
    for s in out.values():
        s["coverage"] = s["compiled"] / s["total"]
    return dict(sorted(out.items()))


def find_schemas(specs: list[str] | None) -> list[Path]:
    """Schema files from directories, globs or files; README and other non-JSON skipped."""
    paths: list[Path] = []
    for spec in specs or [str(DEFAULT_SCHEMAS)]:
        p = Path(spec)
        found = (
            sorted(p.glob("*.json")) if p.is_dir() else [Path(x) for x in sorted(glob.glob(spec))]
        )
        paths.extend(x for x in found if x.suffix == ".json")
    if not paths:
        raise SystemExit(f"no schema files found in {specs or [str(DEFAULT_SCHEMAS)]}")
    return list(dict.fromkeys(paths))


def load_job(path: Path) -> tuple[str, Any]:
    data = json.loads(path.read_text())
    return path.name, data["schema"] if isinstance(data, dict) and "schema" in data else data


def _fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "-"
    if unit == "s":
        return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:.2f}{unit}"


def markdown(result: dict[str, Any]) -> str:
    s, meta = result["summary"], result["meta"]
    lines = [
        "# Compile benchmark",
        "",
        f"{s['total']} schemas from `{meta['schemas']}`; vocabulary {meta['vocab_size']} tokens; "
        f"limit {meta['timeout_s']:g} s for (a)+(b) per schema; {meta['workers']} worker(s). "
        "(a) outlines-core Index alone on our regex; (b) compile_constraint end to end; "
        "(c) a TableCache hit. Times over the schemas that compiled.",
        "",
        "| | p50 | p90 |",
        "|---|---|---|",
    ]
    for key, label in (
        ("a", "(a) outlines-core Index"),
        ("b", "(b) ours, end to end"),
        ("c", "(c) cache hit"),
    ):
        p50, p90 = s[f"{key}_s_p50"], s[f"{key}_s_p90"]
        fmt = (lambda v: "-" if v is None else f"{v * 1e6:.1f} µs") if key == "c" else _fmt
        lines.append(f"| {label} | {fmt(p50)} | {fmt(p90)} |")
    lines.append(f"| regex building (in b) | {_fmt(s['regex_s_p50'])} | {_fmt(s['regex_s_p90'])} |")
    lines += [
        "",
        f"- coverage: **{s['compiled']}/{s['total']} = {100 * (s['coverage'] or 0):.1f}%**",
        f"- overhead b/a: median of per-schema ratios **{_fmt(s['overhead_ratio_p50'], 'x')}** "
        f"(p90 {_fmt(s['overhead_ratio_p90'], 'x')}); ratio of medians "
        f"{_fmt(s['overhead_ratio_of_medians'], 'x')}",
        f"- table memory vs dense S x V int64: p50 {_fmt(s['table_pct_of_dense_p50'], '%')}, "
        f"p90 {_fmt(s['table_pct_of_dense_p90'], '%')}, "
        f"max {_fmt(s['table_pct_of_dense_max'], '%')}; "
        f"{s['table_over_2pct_of_dense']} tables over 2% "
        f"(with every token set packed: p50 {_fmt(s['all_packed_pct_of_dense_p50'], '%')}, "
        f"{s['all_packed_over_2pct_of_dense']} over 2%)",
        f"- the engine's mask rows per table (untimed; forward rows, group tests, tight rows "
        f"built up front) vs the same dense tensor: p50 {_fmt(s['runtime_pct_of_dense_p50'], '%')}"
        f", p90 {_fmt(s['runtime_pct_of_dense_p90'], '%')}, "
        f"max {_fmt(s['runtime_pct_of_dense_max'], '%')}",
        "",
        "## Failures",
        "",
        "| count | reason | examples |",
        "|---:|---|---|",
    ]
    for g in result["failures"]:
        reason = g["reason"].replace("|", "\\|")
        lines.append(f"| {g['count']} | {reason} | {', '.join(g['examples'])} |")
    lines += [
        "",
        "## Coverage by subset",
        "",
        "| subset | compiled | total | coverage |",
        "|---|---:|---:|---:|",
    ]
    for name, sub in result["subsets"].items():
        lines.append(
            f"| {name} | {sub['compiled']} | {sub['total']} | {100 * sub['coverage']:.0f}% |"
        )
    if result.get("split"):
        phases = ("regex", "index", "reduce", "parse", "drop_index", "finish", "shortest")
        lines += [
            "",
            "## Where (b) goes: the slowest compiles, phase by phase (seconds)",
            "",
            "| file | states | blob MB | " + " | ".join(phases) + " |",
            "|---|---:|---:|" + "---:|" * len(phases),
        ]
        for r in result["split"]:
            if r["ok"]:
                cells = " | ".join(f"{r[f'{p}_s']:.3f}" for p in phases)
                lines.append(
                    f"| {r['file']} | {r['states']} | {r['blob_bytes'] / 1e6:.1f} | {cells} |"
                )
    return "\n".join(lines) + "\n"


def _progress(i: int, n: int, row: dict[str, Any]) -> None:
    if row["ok"]:
        tail = f"a {_fmt(row['a_s'])}  b {_fmt(row['b_s'])}  b/a {row['ratio']:.2f}"
    else:
        tail = f"FAIL {row['reason']}"
    print(f"[{i + 1}/{n}] {row['file']}: {tail}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write all rows and the summary here (and a .md beside it)")
    ap.add_argument(
        "--schemas", nargs="+", help=f"directories or globs (default {DEFAULT_SCHEMAS})"
    )
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds for (a)+(b) per schema")
    ap.add_argument("--limit", type=int, help="only the first N schemas (sorted by name)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--split", type=int, default=6, help="phase split of the N slowest compiles")
    args = ap.parse_args(argv)
    if args.workers < 1:
        raise SystemExit("--workers must be at least 1")

    from gclm.server.engine.model_loader import load_tokenizer

    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(None))
    paths = find_schemas(args.schemas)[: args.limit]
    result = bench(
        [load_job(p) for p in paths],
        vocab,
        CompileLimits(timeout_s=args.timeout),
        workers=args.workers,
        split=args.split,
        log=_progress,
    )
    result["meta"]["schemas"] = " ".join(args.schemas or [str(DEFAULT_SCHEMAS)])
    s = result["summary"]
    print(markdown(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        Path(args.json).with_suffix(".md").write_text(markdown(result))
    print(
        f"coverage {s['coverage']:.3f}, overhead_ratio_p50 {s['overhead_ratio_p50']}",
        file=sys.stderr,
    )
    return result


def bench(
    jobs: list[tuple[str, Any]],
    vocab: TokenVocabulary,
    limits: CompileLimits,
    *,
    workers: int = 1,
    split: int = 0,
    log: Any = None,
) -> dict[str, Any]:
    """The whole measurement on (name, schema) jobs: rows, summary, failures, subsets."""
    started = time.time()
    rows = run_all(jobs, "time", vocab, limits, workers, log)
    slowest = sorted((r for r in rows if r["ok"]), key=lambda r: -r["b_s"])[:split]
    schemas = dict(jobs)
    split_rows = run_all(
        [(r["file"], schemas[r["file"]]) for r in slowest], "split", vocab, limits, 1
    )
    from importlib.metadata import version

    return {
        "meta": {
            "timeout_s": limits.timeout_s,
            "memory_bytes": limits.memory_bytes,
            "max_states": limits.max_states,
            "workers": workers,
            "vocab_size": vocab.size,
            "outlines_core": version("outlines-core"),
            "compiler_sha256": _source_hash(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "wall_s": time.time() - started,
            "schemas": "",
        },
        "summary": summarize(rows),
        "failures": group_failures(rows),
        "subsets": by_subset(rows),
        "split": split_rows,
        "rows": rows,
    }


def _source_hash() -> str:
    """sha256 over compiler/**/*.py as imported: ties the figures to one state of the code."""
    import gclm.compiler

    root = Path(gclm.compiler.__file__).parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    main()
