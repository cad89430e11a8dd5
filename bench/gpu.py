"""The transformers engine on an accelerator: constrained vs unconstrained, one run, JSON.

    python -m bench.gpu [--device cuda|cpu] [--weights embedded|random] [--model-dir DIR]
                        [--batches 1 8 32 64] [--max-tokens N] [--json PATH]

One BatchEngine (as `gclm serve` builds it, in bfloat16 on CUDA) serves, for each batch size
B, B clients at a time sending chat requests for `--waves` x B requests, greedy, side by
side in each repeat (unconstrained, then constrained):

- (a) constrained: a JSON Schema per request (three schemas in turn), budget-aware with the
  server's default "graceful" policy, every output validated with jsonschema;
- (b) unconstrained: the same prompts and max_tokens, no constraint.

Per arm and B it reports output tokens/s (median over `--repeats`), the engine's mean step
time, time to first token (submit to first token, median and p90), output lengths and finish
reasons; per B the ratio a/b, the same ratio against unconstrained outputs cut to the
constrained ones' median length (like with like: (a) closes its JSON early), the ratio of
their step times, and the mask's share of a constrained step, measured in a pass
of its own that synchronises the device around the mask (`_mask`) and each step, so the
share is the mask's serial cost and the throughput passes stay unperturbed. The issue's
targets (on one H200, the embedded model in bf16) are pass/fail fields computed from those.

`--weights embedded` loads the embedded SmolLM2-135M-Instruct (its package must be
installed); `--weights random` builds the model in `--model-dir` (config and tokenizer, as
bench/gpu_bundle.py writes them) with random weights, seeded: the same shapes and so the same
cost per token, outputs as long as the budget allows. `--device cpu` is a dry run: small
batches and budgets by default, done in a minute or two on two cores. The JSON is rewritten
after every batch size, so a run cut short still leaves what it measured.

CUDA default sizes, estimated from bench/results/gpu_h200.json (the first engine on an H200:
18 ms a step at batch 1, 24 ms unconstrained and 78 ms constrained at batch 32): 2 waves of
128 tokens are about 256 steps per arm and B; at 25 ms unconstrained and at most 150 ms
constrained (batch 64) that is under 3 minutes for both arms over 1/8/32/64 with 2 repeats,
plus the model's conversion and load (~30 s), the compiles and the profiled pass: about 4
minutes, under the 10 a device command may run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.masking.state import check_budget
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.transformers.engine import BatchEngine

STR = {"type": "string", "maxLength": 40}
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": STR, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "city": STR,
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "array", "items": {"type": "integer"}, "maxItems": 5},
        },
        "required": ["city", "unit", "days"],
    },
    {
        "type": "object",
        "properties": {
            "title": STR,
            "done": {"type": "boolean"},
            "tags": {"type": "array", "items": STR, "maxItems": 3},
        },
        "required": ["title", "done", "tags"],
    },
]
PROMPTS = [
    "Invent a person and answer in JSON.",
    "Describe tomorrow's weather in Paris as JSON.",
    "Give me one task from a to-do list as JSON.",
    "Write a haiku about the sea.",
]
# The targets: constrained at least this share of unconstrained at every batch size;
# batch 1 at least this many times the first engine's 56 tokens/s on an H200; batch 64 at
# least this many times batch 1.
RATIO_TARGET = 0.9
OLD_BATCH1_TPS = 56.0
BATCH1_TARGET = 5.0
SCALING_TARGET = 10.0
DEFAULTS = {  # per device: batches, max_tokens, waves, repeats
    "cuda": ([1, 8, 32, 64], 128, 2, 2),
    "cpu": ([1, 2], 24, 1, 1),
}


@dataclass
class Arm:
    """What one pass of `requests` requests, `batch` at a time, measured."""

    tokens: int = 0
    seconds: float = 0.0
    steps: float = 0.0
    step_seconds: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    finishes: Counter[str] = field(default_factory=Counter)
    invalid: list[str] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


def load(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(model, tokenizer, dtype name) on args.device: bf16 on CUDA, the server's default on
    the CPU."""
    from gclm.server.engine.model_loader import load_model, load_tokenizer

    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "auto")
    if args.weights == "embedded":
        loaded = load_model(None, device=args.device, dtype=dtype)
        return loaded.model, loaded.tokenizer, str(loaded.dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    from gclm.server.engine.model_loader import resolve_device, resolve_dtype

    if args.model_dir is None:
        raise SystemExit("--weights random needs --model-dir (bench/gpu_bundle.py writes one).")
    device = resolve_device(args.device)
    torch_dtype = resolve_dtype(dtype, device)
    tokenizer = load_tokenizer(str(args.model_dir))
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return model.to(device).eval(), tokenizer, str(torch_dtype)


def build_engine(model: Any, tokenizer: Any, max_batch: int, device: str) -> BatchEngine:
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
    # On the CPU a small KV cache: the default takes a quarter of the machine's memory.
    kv_memory = None if device == "cuda" else 256 << 20
    return BatchEngine(
        model,
        tokenizer,
        model_id="bench",
        vocab=vocab,
        cache=cache,
        max_batch=max_batch,
        kv_memory=kv_memory,
        queue_size=1024,
    )


async def run_arm(
    engine: BatchEngine,
    prompts: list[list[int]],
    tables: list[tuple[CompiledTable, dict[str, Any]] | None],
    max_tokens: int,
    batch: int,
) -> Arm:
    """Send every prompt (with its table and schema, or none), `batch` at a time."""
    import jsonschema

    arm = Arm()
    gate = asyncio.Semaphore(batch)
    policy = engine.constraints.budget_policy("graceful")

    async def one(prompt: list[int], constraint: tuple[CompiledTable, dict[str, Any]] | None):
        async with gate:
            table = None if constraint is None else constraint[0]
            request = GenerationRequest(
                prompt,
                SamplingParams(max_tokens=max_tokens, temperature=0.0),
                constraint=None if table is None else PreparedConstraint.of(table, policy=policy),
            )
            started = time.perf_counter()
            handle = engine.submit(request)
            text, first = [], None
            async for event in engine.stream(handle):
                if isinstance(event, TokenEvent):
                    if first is None:
                        first = time.perf_counter() - started
                    text.append(event.text)
                elif isinstance(event, FinishEvent):
                    arm.tokens += event.completion_tokens
                    arm.lengths.append(event.completion_tokens)
                    arm.finishes[event.finish_reason] += 1
                elif isinstance(event, ErrorEvent):
                    raise event.error
            if first is not None:
                arm.first_token_s.append(first)
            if constraint is not None:
                output = "".join(text)
                try:
                    jsonschema.validate(json.loads(output), constraint[1])
                except (ValueError, jsonschema.ValidationError):
                    arm.invalid.append(output)

    before = engine.stats().gauges
    started = time.perf_counter()
    await asyncio.gather(*(one(p, t) for p, t in zip(prompts, tables, strict=True)))
    arm.seconds = time.perf_counter() - started
    after = engine.stats().gauges
    arm.steps = after["steps"] - before["steps"]
    arm.step_seconds = after["step_seconds"] - before["step_seconds"]
    return arm


async def mask_share(
    engine: BatchEngine,
    prompts: list[list[int]],
    tables: list[tuple[CompiledTable, dict[str, Any]] | None],
    max_tokens: int,
    batch: int,
) -> dict[str, float]:
    """The mask's serial share of a constrained step: one pass with the device synchronised
    around each step and each mask (the engine's `_mask`, every row of a step)."""
    cuda = engine.device.type == "cuda"
    spent = {"mask": 0.0, "step": 0.0, "masks": 0, "steps": 0}
    mask, step = engine._mask, engine._step

    def timed(name: str, inner: Any) -> Any:
        def call(*a: Any) -> Any:
            if cuda:
                torch.cuda.synchronize()
            t = time.perf_counter()
            result = inner(*a)
            if cuda:
                torch.cuda.synchronize()
            spent[name] += time.perf_counter() - t
            spent[name + "s"] += 1
            return result

        return call

    engine._mask, engine._step = timed("mask", mask), timed("step", step)  # type: ignore[method-assign]
    try:
        await run_arm(engine, prompts, tables, max_tokens, batch)
    finally:
        del engine._mask, engine._step  # the class's methods again
    return {
        "mask_share": spent["mask"] / spent["step"],
        "mask_ms_per_step": 1e3 * spent["mask"] / spent["steps"],
        "step_ms_synced": 1e3 * spent["step"] / spent["steps"],
    }


def summary(arms: list[Arm]) -> dict[str, Any]:
    """The median repeat's figures (by tokens/s) and every repeat's tokens/s."""
    tps = [a.tps for a in arms]
    mid = sorted(arms, key=lambda a: a.tps)[len(arms) // 2]
    firsts = sorted(t for a in arms for t in a.first_token_s)
    return {
        "tokens_per_s": statistics.median(tps),
        "tokens_per_s_repeats": tps,
        "step_ms": 1e3 * mid.step_seconds / max(1.0, mid.steps),
        "steps": mid.steps,
        "first_token_ms_median": 1e3 * statistics.median(firsts) if firsts else None,
        "first_token_ms_p90": 1e3 * firsts[int(0.9 * (len(firsts) - 1))] if firsts else None,
        "mean_tokens": statistics.mean(a for arm in arms for a in arm.lengths),
        "finish_reasons": dict(sum((a.finishes for a in arms), Counter())),
        "outputs": sum(len(a.lengths) for a in arms),
        "invalid_outputs": sum(len(a.invalid) for a in arms),
        "invalid_examples": [t for a in arms for t in a.invalid][:3],
    }


def targets(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets as pass/fail fields (None where a batch size was not run)."""
    out: dict[str, Any] = {
        f"constrained_ge_{RATIO_TARGET}x_unconstrained_b{b}": r["constrained_ratio"] >= RATIO_TARGET
        for b, r in rows.items()
    }
    one, top = rows.get(1), rows.get(64)
    need = BATCH1_TARGET * OLD_BATCH1_TPS
    out[f"batch1_ge_{need:.0f}_tps"] = (
        None
        if one is None
        else min(one["constrained"]["tokens_per_s"], one["unconstrained"]["tokens_per_s"]) >= need
    )
    out[f"batch64_ge_{SCALING_TARGET:.0f}x_batch1"] = (
        None
        if one is None or top is None
        else all(
            top[arm]["tokens_per_s"] >= SCALING_TARGET * one[arm]["tokens_per_s"]
            for arm in ("constrained", "unconstrained")
        )
    )
    out["every_constrained_output_valid"] = all(
        r["constrained"]["invalid_outputs"] == 0 for r in rows.values()
    )
    known = [v for v in out.values() if v is not None]
    out["all_pass"] = all(known) and len(known) == len(out)
    return out


def commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


async def bench(args: argparse.Namespace, report: dict[str, Any]) -> None:
    model, tokenizer, dtype = load(args)
    report["dtype"] = dtype
    report["load_s"] = time.perf_counter() - report.pop("_started")
    engine = build_engine(model, tokenizer, max(args.batches), args.device)
    try:
        compiled = []
        for schema in SCHEMAS:
            table = await engine.constraints.compile(Constraint.json_schema(schema))
            check_budget(table, args.max_tokens)  # BudgetTooSmallError names the minimum
            compiled.append((table, schema))
        chats = [engine.prompts.render_chat([{"role": "user", "content": p}]) for p in PROMPTS]
        ids = [engine.prompts.encode_prompt(c) for c in chats]
        top = max(args.batches)
        # Warm-up: the largest batch once, so the KV buffers have grown before timing.
        warm = [ids[i % len(ids)] for i in range(top)]
        await run_arm(engine, warm, [None] * top, args.max_tokens, top)
        await run_arm(engine, warm, [compiled[i % 3] for i in range(top)], args.max_tokens, top)
        rows: dict[int, dict[str, Any]] = {}
        for batch in args.batches:
            n = args.waves * batch
            prompts = [ids[i % len(ids)] for i in range(n)]
            tables = [compiled[i % len(compiled)] for i in range(n)]
            free: list[Any] = [None] * n
            arms: dict[str, list[Arm]] = {"unconstrained": [], "constrained": []}
            for _ in range(args.repeats):  # side by side in each repeat
                arms["unconstrained"].append(
                    await run_arm(engine, prompts, free, args.max_tokens, batch)
                )
                arms["constrained"].append(
                    await run_arm(engine, prompts, tables, args.max_tokens, batch)
                )
            row: dict[str, Any] = {k: summary(v) for k, v in arms.items()}
            row["constrained_ratio"] = (
                row["constrained"]["tokens_per_s"] / row["unconstrained"]["tokens_per_s"]
            )
            # Like with like: unconstrained outputs as long as the constrained ones (their
            # median), and the step times, which do not depend on the lengths.
            equal = max(
                1, round(statistics.median(n for a in arms["constrained"] for n in a.lengths))
            )
            short = [
                await run_arm(engine, prompts, free, equal, batch) for _ in arms["constrained"]
            ]
            row["unconstrained_equal_length"] = summary(short)
            row["constrained_ratio_equal_length"] = (
                row["constrained"]["tokens_per_s"]
                / row["unconstrained_equal_length"]["tokens_per_s"]
            )
            row["constrained_step_ratio"] = (
                row["constrained"]["step_ms"] / row["unconstrained"]["step_ms"]
            )
            profiled = tables[:batch]
            row.update(await mask_share(engine, prompts[:batch], profiled, args.max_tokens, batch))
            rows[batch] = row
            report["batches"] = rows
            report["targets"] = targets(rows)
            print_row(batch, row)
            write(args, report)
        report["engine_counters"] = engine.stats().gauges
    finally:
        engine.shutdown()


def print_row(batch: int, row: dict[str, Any]) -> None:
    c, u = row["constrained"], row["unconstrained"]
    print(
        f"B={batch:3d}  constrained {c['tokens_per_s']:8.1f} tok/s  unconstrained "
        f"{u['tokens_per_s']:8.1f} tok/s  ratio {row['constrained_ratio']:.2f} "
        f"({row['constrained_ratio_equal_length']:.2f} at equal lengths, "
        f"{row['constrained_step_ratio']:.2f} per step)  "
        f"step {c['step_ms']:.1f}/{u['step_ms']:.1f} ms  mask {100 * row['mask_share']:.0f}% "
        f"of a step  first token {c['first_token_ms_median']:.0f}/"
        f"{u['first_token_ms_median']:.0f} ms  invalid {c['invalid_outputs']}/{c['outputs']}  "
        f"mean tokens {c['mean_tokens']:.0f}/{u['mean_tokens']:.0f}",
        flush=True,
    )


def write(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--weights", choices=["embedded", "random"], default="embedded")
    ap.add_argument("--model-dir", type=Path, help="config and tokenizer (--weights random)")
    ap.add_argument("--dtype", choices=["bfloat16", "float32", "float16"])
    ap.add_argument("--batches", type=int, nargs="+")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--waves", type=int, help="requests per batch size, in batches")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    batches, max_tokens, waves, repeats = DEFAULTS[args.device]
    args.batches = args.batches or batches
    args.max_tokens = args.max_tokens or max_tokens
    args.waves = args.waves or waves
    args.repeats = args.repeats or repeats
    if min(args.batches) < 1 or args.waves < 1 or args.repeats < 1:
        ap.error("--batches, --waves and --repeats must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    import transformers

    report: dict[str, Any] = {
        "_started": time.perf_counter(),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.machine(),
        "weights": args.weights,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "commit": commit(),
        "max_tokens": args.max_tokens,
        "waves": args.waves,
        "repeats": args.repeats,
        "targets_hold_for": "one H200, the embedded model (--weights embedded) in bfloat16",
    }
    started = time.perf_counter()
    asyncio.run(bench(args, report))
    report["wall_s"] = time.perf_counter() - started
    write(args, report)
    print(json.dumps(report["targets"], indent=2))
    return report


if __name__ == "__main__":
    main()
