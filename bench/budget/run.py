"""The GCLM budget table on a real model: forward-only DFA vs budget-aware vs graceful.

    python -m bench.budget [--half reporting|tuning] [--json PATH] [--quick] [--samples N]
                           [--bench-schemas K] [--arms A,B,...] [--horizon H ...]

Runs the embedded model (SmolLM2-135M-Instruct) on the CPU through the engine itself
(`build_engine`, batches of 16), on one half of the schemas: three hand-written ones of that
half plus K (default 25) sampled from that half of ../shared/jsonschemabench: files sorted
by name, grouped by subset (the file-name prefix before `---` or `_<n>`), each subset
shuffled with a fixed seed, then one file from each subset in turn until K are picked. A
file's half is fixed by its name alone (`half_of`); the graceful policy was tuned on the
tuning half, and the reporting half is what the README quotes.

Every schema is compiled with `engine.constraints.compile`; the ones that fail count against
coverage and are left out of every arm. For each compiled schema with shortest output `min_tokens`,
the budget levels are min, min+2, min+5, 16, 32 and 64, keeping those >= min_tokens (levels
that land on the same budget run once and count for each). At each budget, with the same
chat prompt (the schema's JSON, cut at --schema-chars characters, and a request for one
JSON value matching it), the arms (default: all but vanilla) generate greedily once and at
temperature 0.7 with N fixed seeds (default N=2):

    vanilla        no constraint; the prompt alone asks for JSON
    forward-only   the DFA mask, budget ignored (budget_aware=False): cut off at max_tokens
    budget-aware   the DFA mask with the budget, no policy (budget_policy "none")
    graceful       budget-aware plus masking/graceful.py (gclm's default; its settings can
                   be changed with --horizon, --reserve, --lateral-penalty, ...)

bench/budget/metrics.py defines each measure (parse, valid, degenerate, hollow share);
bench/budget/report.py writes the table and the figure.
Writes bench/results/budget.md and budget.png for the reporting half, budget_tuning.md and
budget_tuning.png for the tuning half (and --json PATH: every row and output).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from bench.budget.forced import Fewest, fewest_non_degenerate
from bench.budget.metrics import (
    aggregate,
    mark_same_outputs,
    score,
    validator_for,
)
from bench.budget.report import ARMS, LEVELS, format_table, machine, write_markdown, write_png
from bench.jsonschemabench import DEFAULT_DIR, subset_of
from gclm.masking.graceful import GracefulPolicy

ROOT = Path(__file__).resolve().parents[2]

BENCH_DIR = DEFAULT_DIR
RESULTS = ROOT / "bench" / "results"
TEMPERATURE = 0.7
SAMPLE_SEED = 1000
PICK_SEED = 20250101

STR = {"type": "string"}

TUNING_SCHEMAS: dict[str, dict[str, Any]] = {
    "seed/person": {
        "type": "object",
        "properties": {
            "name": STR,
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["name", "age", "email"],
        "additionalProperties": False,
    },
    "seed/order": {
        "type": "object",
        "properties": {
            "order_id": STR,
            "items": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": STR,
                        "qty": {"type": "integer", "minimum": 1},
                        "price": {"type": "number", "minimum": 0},
                    },
                    "required": ["sku", "qty", "price"],
                    "additionalProperties": False,
                },
            },
            "address": {
                "type": "object",
                "properties": {"street": STR, "city": STR, "zip": STR},
                "required": ["street", "city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["order_id", "items", "address"],
        "additionalProperties": False,
    },
    "seed/tool_call": {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {
                "type": "object",
                "properties": {
                    "city": STR,
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
}


# Written after the policy was tuned; never used for tuning.
REPORTING_SCHEMAS: dict[str, dict[str, Any]] = {
    "seed/event": {
        "type": "object",
        "properties": {
            "title": STR,
            "date": {"type": "string", "format": "date"},
            "attendees": {"type": "array", "items": STR, "minItems": 1, "maxItems": 5},
            "location": STR,
        },
        "required": ["title", "date", "attendees", "location"],
        "additionalProperties": False,
    },
    "seed/review": {
        "type": "object",
        "properties": {
            "product": STR,
            "rating": {"type": "integer", "minimum": 1, "maximum": 5},
            "pros": {"type": "array", "items": STR},
            "cons": {"type": "array", "items": STR},
            "summary": STR,
        },
        "required": ["product", "rating", "summary"],
    },
    "seed/bug_report": {
        "type": "object",
        "properties": {
            "component": {"enum": ["api", "ui", "db"]},
            "severity": {"enum": ["low", "medium", "high"]},
            "steps": {"type": "array", "items": STR, "minItems": 1},
            "expected": STR,
            "actual": STR,
        },
        "required": ["component", "severity", "steps", "expected", "actual"],
        "additionalProperties": False,
    },
}
HALVES = {"tuning": TUNING_SCHEMAS, "reporting": REPORTING_SCHEMAS}


def half_of(filename: str) -> str:
    """The half a jsonschemabench file belongs to, fixed by its name alone."""
    return ("tuning", "reporting")[hashlib.sha256(filename.encode()).digest()[0] % 2]


def pick_bench_files(names: list[str], count: int, seed: int = PICK_SEED) -> list[str]:
    """`count` file names spread evenly over the subsets, deterministically."""
    by_subset: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        by_subset[subset_of(name)].append(name)
    rng = random.Random(seed)
    queues = []
    for subset in sorted(by_subset):
        files = by_subset[subset][:]
        rng.shuffle(files)
        queues.append(files)
    picked: list[str] = []
    while len(picked) < count and any(queues):
        for files in queues:
            if files and len(picked) < count:
                picked.append(files.pop())
    return picked


def load_schemas(bench_count: int, half: str) -> list[tuple[str, Any]]:
    """(name, schema) pairs of one half: its hand-written schemas, then the sampled
    jsonschemabench ones."""
    out = list(HALVES[half].items())
    names = [p.name for p in BENCH_DIR.glob("*.json") if half_of(p.name) == half]
    for name in pick_bench_files(names, bench_count):
        data = json.loads((BENCH_DIR / name).read_text())
        out.append((f"bench/{name.removesuffix('.json')}", data["schema"]))
    return out


def prompt_messages(schema: Any, limit: int) -> list[dict[str, str]]:
    """The one chat prompt every arm gets for `schema` (its JSON cut at `limit` chars)."""
    text = json.dumps(schema, separators=(",", ":"))
    if len(text) > limit:
        text = text[:limit] + " ...(truncated)"
    return [
        {
            "role": "user",
            "content": "Reply with one JSON value that matches this JSON Schema, and nothing "
            f"else.\nSchema: {text}",
        }
    ]


def level_budgets(min_tokens: int) -> dict[str, int]:
    """Budget of each level that is at least `min_tokens`."""
    budgets = {
        "min": min_tokens,
        "min+2": min_tokens + 2,
        "min+5": min_tokens + 5,
        "16": 16,
        "32": 32,
        "64": 64,
    }
    return {level: b for level, b in budgets.items() if b >= min_tokens}


@dataclass
class Job:
    schema: str
    arm: str
    budget: int
    levels: list[str]
    temperature: float
    seed: int
    prompt_ids: list[int]
    table: Any = None
    text: str = ""
    tokens: int = 0
    finish_reason: str = ""
    error: str = ""


def make_jobs(
    schema: str,
    table: Any,
    prompt_ids: list[int],
    samples: list[tuple[float, int]],
    arms: list[str] = ARMS,
    levels: list[str] = LEVELS,
) -> list[Job]:
    """Every (arm, budget, sample) for one compiled schema, at the given levels."""
    by_budget: dict[int, list[str]] = defaultdict(list)
    for level, budget in level_budgets(table.min_tokens).items():
        if level in levels:
            by_budget[budget].append(level)
    return [
        Job(schema, arm, budget, levels, temperature, seed, prompt_ids, table)
        for arm in arms
        for budget, levels in by_budget.items()
        for temperature, seed in samples
    ]


async def run_job(
    engine: Any, job: Job, policy: Any, done: list[int], total: int, started: float
) -> None:
    from gclm.server.engine.protocol import (
        ErrorEvent,
        FinishEvent,
        GenerationRequest,
        PreparedConstraint,
        SamplingParams,
        TokenEvent,
    )

    request = GenerationRequest(
        prompt_ids=job.prompt_ids,
        params=SamplingParams(max_tokens=job.budget, temperature=job.temperature, seed=job.seed),
        constraint=None
        if job.arm == "vanilla"
        else PreparedConstraint.of(
            job.table,
            budget_aware=job.arm != "forward-only",
            policy=policy if job.arm == "graceful" else None,
        ),
    )
    parts = []
    try:
        handle = engine.submit(request)
        async for event in engine.stream(handle):
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, FinishEvent):
                job.tokens, job.finish_reason = event.completion_tokens, event.finish_reason
            elif isinstance(event, ErrorEvent):
                job.finish_reason, job.error = "error", repr(event.error)
    except Exception as e:  # noqa: BLE001 - every failure is a result here
        job.finish_reason, job.error = "error", repr(e)
    job.text = "".join(parts)
    done[0] += 1
    if done[0] % 50 == 0 or done[0] == total:
        elapsed = time.perf_counter() - started
        print(f"  {done[0]}/{total} sequences, {elapsed:.0f} s", file=sys.stderr, flush=True)


POLICY_SETTINGS = GracefulPolicy.settings()


def policy_settings(args: argparse.Namespace) -> dict[str, float]:
    return {name: getattr(args, name) for name in POLICY_SETTINGS}


class TimedPolicy:
    """The graceful policy, timed per call against the mask fill + apply of the same row."""

    def __init__(self, policy: GracefulPolicy, vocab_size: int) -> None:
        import torch

        from gclm.masking import allocate_bitmask

        self.policy = policy
        self.bitmask = allocate_bitmask(1, vocab_size)
        self.scratch = torch.empty(1, vocab_size)
        self.mask_us: list[float] = []
        self.policy_us: list[float] = []

    def adjust(self, logits: Any, state: Any, tokens_left: int, budget: int) -> None:
        from gclm.masking import apply_bitmask, fill_bitmask

        self.scratch.copy_(logits[None, : self.scratch.shape[1]])
        t0 = time.perf_counter()
        fill_bitmask(self.bitmask, 0, state, tokens_left)
        apply_bitmask(self.scratch, self.bitmask)
        t1 = time.perf_counter()
        self.policy.adjust(logits, state, tokens_left, budget)
        t2 = time.perf_counter()
        self.mask_us.append(1e6 * (t1 - t0))
        self.policy_us.append(1e6 * (t2 - t1))

    def summary(self) -> str:
        if not self.policy_us:
            return "not measured (no graceful arm)"
        p, m = np.array(self.policy_us), np.array(self.mask_us)
        return (
            f"policy p50 {np.median(p):.1f} us, p99 {np.percentile(p, 99):.1f} us; mask fill + "
            f"apply p50 {np.median(m):.1f} us, p99 {np.percentile(m, 99):.1f} us "
            f"(policy / mask, median of per-call ratios: {np.median(p / m):.2f}; "
            f"{len(p)} calls)"
        )


def fewest_tokens(table: Any, schema: Any, vocab: Any) -> Fewest:
    """Bounds on the fewest tokens of a non-degenerate output of `schema` (compiled to
    `table` over `vocab`), by bench/budget/forced.py: a budget below them is *forced*."""
    validator = validator_for(schema)

    def is_degenerate(text: str) -> bool | None:
        measured = score(text, schema, validator)
        return measured.degenerate if measured.valid else None

    return fewest_non_degenerate(schema, table, vocab, is_degenerate)


async def generate(args: argparse.Namespace) -> dict[str, Any]:
    """Compile, build every job, run them all through one engine; return the raw results."""
    import torch

    from gclm.compiler.front.constraint import Constraint
    from gclm.server.launch import build_engine
    from gclm.server.settings import ServerSettings

    torch.set_num_threads(args.threads)
    # float32, as every published budget table was run (the server's own default on a CPU
    # with bf16 instructions is bfloat16 since issue 12; the report names float32).
    settings = ServerSettings(
        device="cpu",
        dtype="float32",
        max_batch=16,
        queue_size=1 << 20,
        compile_timeout=args.compile_timeout,
    )
    built = build_engine(settings)
    engine = built.engine
    try:
        schemas = load_schemas(args.bench_schemas, args.half)
        if args.only:
            schemas = [(n, s) for n, s in schemas if any(o in n for o in args.only.split(","))]
        compiled: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for name, schema in schemas:
            try:
                compiled[name] = await engine.constraints.compile(Constraint.json_schema(schema))
            except Exception as e:  # noqa: BLE001 - a failed compile is a coverage figure
                failures[name] = f"{type(e).__name__}: {e}"
        print(f"compiled {len(compiled)}/{len(schemas)} schemas", file=sys.stderr)
        by_name = dict(schemas)
        fewest = {
            name: fewest_tokens(table, by_name[name], engine.vocab)
            for name, table in compiled.items()
        }
        samples = [(0.0, 0)] + [(TEMPERATURE, SAMPLE_SEED + i) for i in range(args.samples)]
        jobs: list[Job] = []
        for name, schema in schemas:
            if name in compiled:
                text = engine.prompts.render_chat(prompt_messages(schema, args.schema_chars))
                ids = engine.prompts.encode_prompt(text)
                jobs += make_jobs(name, compiled[name], ids, samples, args.arms, args.levels)
        started = time.perf_counter()
        done = [0]
        policy = TimedPolicy(
            GracefulPolicy.for_vocab(engine.vocab.token_bytes, **policy_settings(args)),
            engine.vocab.size,
        )
        await asyncio.gather(*(run_job(engine, j, policy, done, len(jobs), started) for j in jobs))
        seconds = time.perf_counter() - started
    finally:
        built.close()
    return {
        "schemas": schemas,
        "compiled": compiled,
        "failures": failures,
        "jobs": jobs,
        "seconds": seconds,
        "model": engine.model_id,
        "policy": policy,
        "fewest": fewest,
    }


def score_jobs(
    schemas: list[tuple[str, Any]], jobs: list[Job], fewest: dict[str, Fewest]
) -> list[dict[str, Any]]:
    """One record per (job, level): the job's output measured against its schema, and
    whether its cell is forced (True: proven that no non-degenerate output fits the budget;
    False: one fits; None: unknown; see bench/budget/forced.py)."""
    by_name = dict(schemas)
    validators = {name: validator_for(by_name[name]) for name in {j.schema for j in jobs}}
    records = []
    for j in jobs:
        measured = asdict(score(j.text, by_name[j.schema], validators[j.schema]))
        for level in j.levels:
            records.append(
                {
                    "schema": j.schema,
                    "arm": j.arm,
                    "level": level,
                    "budget": j.budget,
                    "min_tokens": j.table.min_tokens,
                    "temperature": j.temperature,
                    "seed": j.seed,
                    "tokens": j.tokens,
                    "finish_reason": j.finish_reason,
                    "error": j.error,
                    "text": j.text,
                    "forced": fewest[j.schema].forced(j.budget),
                    **measured,
                }
            )
    return records


def arm3_failures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Budget-aware outputs that break the guarantee: invalid, errored, over budget, cut off."""
    return [
        r
        for r in records
        if r["arm"] in ("budget-aware", "graceful")
        and not r["validator_error"]
        and (
            not r["valid"]
            or r["error"]
            or r["tokens"] > r["budget"]
            or r["finish_reason"] != "stop"
        )
    ]


def rescore(path: Path, bench_count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records and info of an earlier --json file, with the forced cells recomputed
    (each schema compiled again in this process, for the embedded model's vocabulary)."""
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.vocab.vocabulary import TokenVocabulary
    from gclm.compiler.whole.compile import compile_constraint
    from gclm.server.engine.model_loader import load_tokenizer

    data = json.loads(path.read_text())
    records, info = data["outputs"], data["info"]
    vocab = TokenVocabulary.from_tokenizer(load_tokenizer())
    names = {r["schema"] for r in records}
    fewest = {}
    for name, schema in load_schemas(bench_count, info["half"]):
        if name in names:
            table = compile_constraint(Constraint.json_schema(schema), vocab)
            fewest[name] = fewest_tokens(table, schema, vocab)
    for r in records:
        r["forced"] = fewest[r["schema"]].forced(r["budget"])
    info["fewest_non_degenerate"] = bounds_info(fewest)
    info.pop("fill_tokens", None)
    info["rescored"] = "python -m bench.budget " + " ".join(sys.argv[1:])
    return records, info


def bounds_info(fewest: dict[str, Fewest]) -> dict[str, dict[str, Any]]:
    """Each schema's bounds on its fewest non-degenerate tokens, for the JSON's info."""
    return {
        name: {"lower": f.lower, "upper": f.upper, "witness": f.witness}
        for name, f in fewest.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.budget", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", type=Path, help="write every row and output here")
    parser.add_argument("--quick", action="store_true", help="5 bench schemas, N=1")
    parser.add_argument("--samples", type=int, default=2, help="seeded samples at T=0.7")
    parser.add_argument("--half", choices=sorted(HALVES), default="reporting")
    parser.add_argument("--bench-schemas", type=int, default=25)
    parser.add_argument("--schema-chars", type=int, default=400, help="schema text in the prompt")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--compile-timeout", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for budget.md/png")
    parser.add_argument("--arms", default=",".join(ARMS[1:]), help="comma-separated arms")
    parser.add_argument("--levels", default=",".join(LEVELS), help="comma-separated levels")
    parser.add_argument("--only", help="comma-separated name parts: run only these schemas")
    parser.add_argument(
        "--rescore",
        type=Path,
        help="no generation: re-measure the outputs of an earlier --json file (its half, "
        "arms and levels; the forced cells recomputed) and rewrite its report",
    )
    for name in POLICY_SETTINGS:
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=float, default=getattr(GracefulPolicy, name))
    args = parser.parse_args()
    args.arms = [a for a in ARMS if a in args.arms.split(",")]
    args.levels = [level for level in LEVELS if level in args.levels.split(",")]
    if args.quick:
        args.bench_schemas, args.samples = 5, 1
    if args.rescore:
        records, info = rescore(args.rescore, args.bench_schemas)
        report(records, info, args)
        return

    raw = asyncio.run(generate(args))
    if args.json:  # the raw outputs first, so that a failure while scoring loses nothing
        args.json.parent.mkdir(parents=True, exist_ok=True)
        keep = [f.name for f in fields(Job) if f.name not in ("table", "prompt_ids")]
        dump = [{k: getattr(j, k) for k in keep} for j in raw["jobs"]]
        args.json.write_text(json.dumps({"raw": dump}))
    records = score_jobs(raw["schemas"], raw["jobs"], raw["fewest"])
    mark_same_outputs(records)
    bench_total = sum(1 for name, _ in raw["schemas"] if name.startswith("bench/"))
    bench_ok = sum(1 for name in raw["compiled"] if name.startswith("bench/"))
    info = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "model": raw["model"],
        "samples": f"greedy once + {args.samples} at T={TEMPERATURE} (seeds {SAMPLE_SEED}..)",
        "schemas": len(raw["schemas"]),
        "compiled": len(raw["compiled"]),
        "coverage": f"{bench_ok}/{bench_total} jsonschemabench schemas compile "
        f"({100 * bench_ok / max(bench_total, 1):.0f}%)",
        "compile_failures": raw["failures"],
        "min_tokens": {name: t.min_tokens for name, t in raw["compiled"].items()},
        "fewest_non_degenerate": bounds_info(raw["fewest"]),
        "generation_seconds": round(raw["seconds"], 1),
        "sequences": len(raw["jobs"]),
        "quick": args.quick,
        "schema_chars": args.schema_chars,
        "threads": args.threads,
        "half": args.half,
        "command": "python -m bench.budget " + " ".join(sys.argv[1:]),
        "seed_schemas": ", ".join(n.removeprefix("seed/") for n in HALVES[args.half]),
        "policy": ", ".join(f"{k} {v:g}" for k, v in policy_settings(args).items()),
        "policy_cost": raw["policy"].summary(),
        "validator_errors": sorted(
            {(r["schema"], r["validator_error"]) for r in records if r["validator_error"]}
        ),
    }
    report(records, info, args)


def report(records: list[dict[str, Any]], info: dict[str, Any], args: argparse.Namespace) -> None:
    """Aggregate the records; print the table; write the markdown, the figure and the JSON."""
    arms = [a for a in ARMS if any(r["arm"] == a for r in records)]
    levels = [lv for lv in LEVELS if any(r["level"] == lv for r in records)]
    rows = aggregate(records, arms, levels)
    failures = arm3_failures(records)
    table = format_table(rows)
    print(table)
    print(f"\ncoverage: {info['coverage']}")
    print(f"budget-aware failures: {len(failures)}")
    for f in failures[:20]:
        print(
            f"  {f['schema']} {f['arm']} budget={f['budget']}: {f['finish_reason']} "
            f"{f['error']} {f['text']!r}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "budget" if info["half"] == "reporting" else "budget_tuning"
    write_markdown(args.out / f"{stem}.md", table, info, failures, rows)
    write_png(rows, args.out / f"{stem}.png")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"info": info, "rows": rows, "failures": failures, "outputs": records}, indent=1
            )
        )


if __name__ == "__main__":
    main()
