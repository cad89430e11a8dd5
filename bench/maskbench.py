"""MaskBench's accept/reject check: gclm, llguidance and XGrammar side by side on one schema set.

    python -m bench.maskbench [--half tune|report|all] [--limit N] [--only TEXT ...]
                              [--engines gclm gclm-spec llguidance xgrammar]
                              [--timeout S] [--json PATH]

For each schema of ../shared/jsonschemabench (MaskBench's dev split: a `schema` and `tests`,
each test a `data` instance marked `valid` by two JSON Schema validators), each engine
compiles the schema for the embedded SmolLM2 tokenizer, then walks each instance's tokens
through what it compiled: an instance is accepted when every token is allowed and the
state after the last one accepts (end of sequence allowed). An engine passes a schema when
it compiles it within --timeout seconds, accepts every valid instance and rejects every
invalid one. Per schema and engine the outcome is one of: pass, compile error, timeout,
invalidation error (an invalid instance accepted: a soundness bug, counted first) or
validation error (a valid instance rejected).

Serializations, the same for every engine: `json.dumps(data, ensure_ascii=False)` (`, ` and
`: ` separators), and the compact form (`,` and `:`). An instance counts as accepted when
either serialization is; so a valid instance needs one accepted, an invalid one needs both
rejected. Tokens are the tokenizer's own encoding of the text (no special tokens).

Engines: gclm compiles with compile_constraint (regex, outlines-core Index, tables; the
server's state limit), with the server's default `--additional-properties declared`, or,
for a schema whose `$ref`s recurse and can be kept as calls, or whose `$ref`s inlined pass a
limit, a PushdownTable (compiler/grown/pushdown.py), as the server serves those by default; and
gclm-spec the same with `spec` (other keys after the declared ones where a schema leaves
additionalProperties unsaid); llguidance 1.x builds an LLMatcher (spec defaults); XGrammar compiles
with `strict_mode=False` (spec defaults for additionalProperties) and `any_whitespace=True`.
Each engine runs in its own worker process, killed and restarted when a schema goes over
the limit. Compile time is the engine's compile call alone, for the schemas it compiled.

Files are ordered and split by a hash of their name: `--half tune` is for tuning the
compiler, `--half report` (the default) for reporting; --limit N then takes the first N of
that order (a sample across the file families). The summary is given for the whole
selection and for each half it holds (`--half all`: both, side by side in one run). With
--json PATH, a markdown summary is written beside it (PATH with .md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_SCHEMAS = Path(__file__).resolve().parents[1].parent / "shared" / "jsonschemabench"
ENGINES = ("gclm", "gclm-spec", "llguidance", "xgrammar")
OUTCOMES = ("pass", "compile_error", "timeout", "validation_error", "invalidation_error")
START_TIMEOUT_S = 900.0  # a worker's imports and tokenizer load; minutes on a loaded machine


# --- schema set -------------------------------------------------------------------------


def _hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def half_of(name: str) -> str:
    """'tune' or 'report', fixed by the file name alone."""
    return "tune" if _hash(name) % 2 == 0 else "report"


def select(directory: Path, half: str, only: list[str] | None, limit: int | None) -> list[Path]:
    """The schema files of `half` ('all' for both) in hash order, filtered and truncated."""
    paths = [p for p in directory.glob("*.json") if half in ("all", half_of(p.name))]
    if only:
        paths = [p for p in paths if any(o in p.name for o in only)]
    return sorted(paths, key=lambda p: _hash(p.name))[:limit]


def serializations(data: Any) -> list[str]:
    """The texts an instance is tried as (see the module docstring)."""
    spaced = json.dumps(data, ensure_ascii=False)
    compact = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return [spaced] if compact == spaced else [spaced, compact]


# --- engines (inside a worker process) --------------------------------------------------


class Engine:
    """One engine over the embedded tokenizer: compile a schema, then test token lists."""

    def __init__(self, name: str, tokenizer: Any):
        self.name, self.eos = name, tokenizer.eos_token_id
        if name.startswith("gclm"):
            from gclm.compiler.vocab.vocabulary import TokenVocabulary

            self.vocab = TokenVocabulary.from_tokenizer(tokenizer)
        elif name == "llguidance":
            import llguidance.hf

            self.lltok = llguidance.hf.from_tokenizer(tokenizer)
        elif name == "xgrammar":
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(tokenizer)
            self.xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        else:
            raise ValueError(f"unknown engine {name!r}; use one of {ENGINES}")

    def compile(self, schema: Any) -> Any:
        """What `accepts` needs; raises on a schema the engine refuses."""
        if self.name.startswith("gclm"):
            from gclm.compiler.front.constraint import Constraint
            from gclm.compiler.front.json_schema.frames import recursive_refs
            from gclm.compiler.grown.pushdown import PushdownTable
            from gclm.compiler.service.worker import CompileLimits
            from gclm.compiler.whole.compile import compile_constraint
            from gclm.errors import CompileLimitError

            objects = "spec" if self.name == "gclm-spec" else "declared"
            constraint = Constraint.json_schema(schema, additional_properties=objects)
            table = None
            if recursive_refs(schema):
                table = PushdownTable.of_constraint(constraint, self.vocab)
            if table is not None:
                return table
            try:
                limit = CompileLimits().max_states
                return compile_constraint(constraint, self.vocab, max_states=limit)
            except CompileLimitError:
                # As the server does: every $ref a call, or large subschemas split into
                # frames (server/engine/prepare.py).
                table = PushdownTable.of_constraint(constraint, self.vocab)
                if table is None:
                    raise
                return table
        if self.name == "llguidance":
            import llguidance

            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
            matcher = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
            if matcher.is_error():
                raise ValueError(matcher.get_error())
            return grammar
        return self.xgr_compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=True, strict_mode=False
        )

    def accepts(self, compiled: Any, tokens: list[int]) -> bool:
        """Whether the token list is a complete output of the compiled schema."""
        if self.name.startswith("gclm"):
            state = compiled.initial
            for token in tokens:
                state = compiled.next_state(state, token)
                if state < 0:
                    return False
            if hasattr(compiled, "accepting"):  # a CompiledTable
                return bool(compiled.accepting[state])
            return bool(compiled.is_accepting(state))  # a PushdownTable
        if self.name == "llguidance":
            import llguidance

            matcher = llguidance.LLMatcher(self.lltok, compiled, log_level=0)
            return (
                matcher.consume_tokens(tokens) and matcher.is_accepting() and not matcher.is_error()
            )
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled)
        return all(matcher.accept_token(t) for t in tokens) and matcher.accept_token(self.eos)


def _serve(conn: Any, name: str) -> None:
    """Worker loop: receive (schema, tests), send ("compiled", {...}) then ("done", {...})."""
    from gclm.server.engine.model_loader import load_tokenizer

    if name == "xgrammar":  # its C++ side logs a warning per unsupported regex feature
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    tokenizer = load_tokenizer(None)
    engine = Engine(name, tokenizer)
    engine.compile({"type": "object", "properties": {"a": {"type": "string"}}})  # warm-up
    conn.send(("ready", {}))
    while True:
        try:
            schema, tests = conn.recv()
        except EOFError:
            return
        started = time.perf_counter()
        try:
            compiled = engine.compile(schema)
        except Exception as e:  # a refusal, or an engine bug: both are compile errors here
            message = getattr(e, "message", None) or str(e) or repr(e)
            keyword = getattr(e, "keyword", None)
            conn.send(("done", {"error": f"{type(e).__name__}: {message}"[:300], "kw": keyword}))
            continue
        conn.send(("compiled", {"compile_s": time.perf_counter() - started}))
        rejected_valid = accepted_invalid = 0
        for test in tests:
            texts = serializations(test["data"])
            accepted = any(
                engine.accepts(compiled, tokenizer.encode(t, add_special_tokens=False))
                for t in texts
            )
            if test["valid"] and not accepted:
                rejected_valid += 1
            if not test["valid"] and accepted:
                accepted_invalid += 1
        conn.send(
            ("done", {"rejected_valid": rejected_valid, "accepted_invalid": accepted_invalid})
        )


class Worker:
    """A spawned worker process for one engine; replaced after a timeout or a crash."""

    def __init__(self, name: str):
        self.name = name
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, self.name), daemon=True)
        self.process.start()
        child.close()
        if not self.conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the {self.name} worker did not start in time")
        self.conn.recv()

    def close(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()

    def run(self, schema: Any, tests: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
        """One schema: compile within `timeout_s`, then walk the tests (another `timeout_s`)."""
        self.conn.send((schema, tests))
        row: dict[str, Any] = {}
        while True:
            ok = False
            try:
                ok = self.conn.poll(timeout_s)
                tag, part = self.conn.recv() if ok else (None, None)
            except (EOFError, OSError):
                tag, part = None, {"error": "the worker died (memory?)"}
            if tag is None:
                stage = "compile" if "compile_s" not in row else "walk"
                self.close()
                self._start()
                row.update(part or {"timeout": f"{stage} over {timeout_s:g} s"})
                return row
            row.update(part)
            if tag == "done":
                return row


def outcome(row: dict[str, Any]) -> str:
    """The row's MaskBench outcome (see the module docstring)."""
    if "timeout" in row:
        return "timeout"
    if "error" in row:
        return "compile_error"
    if row["accepted_invalid"]:
        return "invalidation_error"
    return "validation_error" if row["rejected_valid"] else "pass"


# --- summary ----------------------------------------------------------------------------


def summarize(rows: list[dict[str, Any]], engines: list[str]) -> dict[str, Any]:
    """Per engine: outcome counts and compile-time percentiles (ms) over compiled schemas."""
    out: dict[str, Any] = {}
    for name in engines:
        results = [r[name] for r in rows]
        counts = Counter(outcome(r) for r in results)
        times = [r["compile_s"] * 1000 for r in results if "compile_s" in r]
        pct = {f"p{q}": float(np.percentile(times, q)) if times else None for q in (50, 90, 99)}
        out[name] = {
            "schemas": len(results),
            **{k: counts.get(k, 0) for k in OUTCOMES},
            "pass_rate": counts.get("pass", 0) / len(results) if results else None,
            "compile_ms": pct,
            "valid_rejected": sum(r.get("rejected_valid", 0) for r in results),
            "invalid_accepted": sum(r.get("accepted_invalid", 0) for r in results),
        }
    return out


def by_half(rows: list[dict[str, Any]], engines: list[str]) -> dict[str, Any]:
    """summarize() over each half of the split the rows hold (see half_of)."""
    halves: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        halves.setdefault(half_of(row["file"]), []).append(row)
    return {half: summarize(halves[half], engines) for half in ("tune", "report") if half in halves}


def _table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| engine | passing | compile error | timeout | validation error (valid rejected) "
        "| invalidation error (invalid accepted) | compile p50 / p90 / p99 (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        p = s["compile_ms"]
        times = " / ".join("-" if p[k] is None else f"{p[k]:.1f}" for k in ("p50", "p90", "p99"))
        lines.append(
            f"| {name} | {s['pass']} ({100 * (s['pass_rate'] or 0):.1f}%) | {s['compile_error']} "
            f"| {s['timeout']} | {s['validation_error']} ({s['valid_rejected']} instances) "
            f"| {s['invalidation_error']} ({s['invalid_accepted']} instances) | {times} |"
        )
    return lines


def markdown(result: dict[str, Any]) -> str:
    meta, summary = result["meta"], result["summary"]
    lines = [
        "# MaskBench accept/reject check (bench/maskbench.py)",
        "",
        f"{meta['schemas']} schemas ({meta['half']} half of `{meta['dir']}`"
        + (f", first {meta['limit']} in hash order" if meta["limit"] else "")
        + (f", only {meta['only']}" if meta["only"] else "")
        + f"), {meta['instances']} instances; compile limit {meta['timeout_s']:g} s; "
        "SmolLM2 tokenizer; one run, engines side by side. Shared 2-core machine: "
        "compare medians and ratios, not absolute times.",
        "",
        *_table(summary),
    ]
    for half, half_summary in result.get("halves", {}).items():
        count = next(iter(half_summary.values()))["schemas"]
        lines += ["", f"The {half} half alone ({count} schemas):", "", *_table(half_summary)]
    if "gclm" in summary:
        failures = Counter(
            f"{outcome(r['gclm'])}: {r['gclm'].get('kw') or ''} "
            f"{re.sub(r' at /[^ ]*', '', r['gclm'].get('error') or '')[:110]}".strip()
            for r in result["rows"]
            if outcome(r["gclm"]) != "pass"
        )
        lines += ["", "gclm's failures by kind:", ""]
        lines += [f"- {n} x {reason}" for reason, n in failures.most_common(25)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=DEFAULT_SCHEMAS)
    ap.add_argument("--half", choices=("tune", "report", "all"), default="report")
    ap.add_argument("--limit", type=int, help="only the first N schemas in hash order")
    ap.add_argument("--only", nargs="+", help="only files whose name contains one of these")
    ap.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    ap.add_argument("--timeout", type=float, default=30.0, help="compile limit per schema (s)")
    ap.add_argument("--json", help="write rows and summary here (and a .md beside it)")
    args = ap.parse_args(argv)
    paths = select(args.dir, args.half, args.only, args.limit)
    workers = {name: Worker(name) for name in args.engines}
    rows: list[dict[str, Any]] = []
    try:
        for i, path in enumerate(paths):
            case = json.loads(path.read_text())
            row: dict[str, Any] = {"file": path.name, "tests": len(case["tests"])}
            for name, worker in workers.items():
                row[name] = worker.run(case["schema"], case["tests"], args.timeout)
            rows.append(row)
            verdicts = " ".join(f"{n}={outcome(row[n])}" for n in workers)
            print(f"[{i + 1}/{len(paths)}] {path.name}: {verdicts}", file=sys.stderr, flush=True)
            if args.json:  # after every schema, so that a run cut short still reports
                write(report(args, rows, list(workers)), Path(args.json))
    finally:
        for worker in workers.values():
            worker.close()
    result = report(args, rows, list(workers))
    print(markdown(result))
    return result


def report(args: argparse.Namespace, rows: list[dict[str, Any]], engines: list[str]) -> dict:
    """The run's metadata, per-engine summary and rows."""
    meta = {
        "dir": str(args.dir),
        "half": args.half,
        "limit": args.limit,
        "only": args.only,
        "schemas": len(rows),
        "instances": sum(r["tests"] for r in rows),
        "timeout_s": args.timeout,
    }
    summary = summarize(rows, engines)
    return {"meta": meta, "summary": summary, "halves": by_half(rows, engines), "rows": rows}


def write(result: dict[str, Any], path: Path) -> None:
    """The JSON at `path` and its markdown summary beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(result))


if __name__ == "__main__":
    main()
