"""Drafts of forced text (fast-forward): tokens/s with and without, same engine, one run.

    python -m bench.drafts [--json PATH] [--repeats N] [--max-tokens N] [--dtype D] [--quick]

Two in-process BatchEngines share the embedded SmolLM2-135M-Instruct (`--dtype`, default the
server's for this machine) and one table cache: `draft_tokens=8` (gclm's default) and `0`
(one token per forward pass). Each schema's chat request is sent alone (concurrency 1), greedy, to
each engine in turn, `--repeats` times; per schema it reports:

- tokens/s of each arm (median over repeats) and their ratio (target >= 1.15 on a schema
  with long fixed keys);
- forward passes per request and the steps saved (1 - passes with / passes without);
- the forced share: draft tokens kept / output tokens (tokens that cost no forward of their
  own);
- whether the two arms' outputs are byte-identical. They are, in float32, up to ties (the
  engine test checks it). In bfloat16 a forward pass over several positions rounds
  differently from one per position, so a near-tie between two tokens can go either way and
  the texts may part there, both valid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.server.engine.model_loader import load_model
from gclm.server.engine.protocol import (
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.transformers.engine import DRAFT_TOKENS, BatchEngine

STR = {"type": "string", "maxLength": 40}


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


SCHEMAS: dict[str, tuple[dict[str, Any], str]] = {
    "long_keys": (
        obj(
            customer_full_legal_name=STR,
            primary_shipping_address_line=STR,
            preferred_delivery_time_window=STR,
            number_of_items_in_the_order={"type": "integer", "minimum": 0, "maximum": 99},
            order_requires_signature_on_delivery={"type": "boolean"},
        ),
        "Invent one online order for a customer in Lisbon, as JSON.",
    ),
    "profile": (
        obj(name=STR, email=STR, city=STR, age={"type": "integer", "minimum": 0}, bio=STR),
        "Invent a user profile for a software engineer in Lisbon and give it as JSON.",
    ),
    "enum_heavy": (
        obj(
            status={"enum": ["pending_payment", "awaiting_shipment", "delivered_to_customer"]},
            priority={"enum": ["low", "normal", "high"]},
            channel={"enum": ["web_storefront", "mobile_application"]},
        ),
        "Classify a late parcel complaint as JSON.",
    ),
}


async def generate(engine: BatchEngine, request: GenerationRequest) -> tuple[str, FinishEvent]:
    """One request's text and its finish event (tests/server/test_engine_drafts.py too)."""
    handle = engine.submit(request)
    text = []
    async for event in engine.stream(handle):
        if isinstance(event, TokenEvent):
            text.append(event.text)
        elif isinstance(event, FinishEvent):
            return "".join(text), event
        else:
            raise event.error
    raise RuntimeError("the stream ended without a finish event")


def one(engine: BatchEngine, request: GenerationRequest) -> dict[str, Any]:
    before = engine.stats()
    started = time.perf_counter()
    text, finish = asyncio.run(generate(engine, request))
    wall = time.perf_counter() - started
    after = engine.stats()
    return {
        "text": text,
        "tokens": finish.completion_tokens,
        "wall_s": wall,
        "passes": after.gauges["forward_passes"] - before.gauges["forward_passes"],
        "kept": after.gauges["draft_tokens_kept"] - before.gauges["draft_tokens_kept"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--dtype", default="auto", help="the model's dtype (default: the server's)")
    ap.add_argument("--quick", action="store_true", help="one repeat, one schema")
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    loaded = load_model(None, device="cpu", dtype=args.dtype)
    tokenizer = loaded.tokenizer
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
    arms = {
        name: BatchEngine(
            loaded.model,
            tokenizer,
            model_id="bench",
            vocab=vocab,
            cache=cache,
            max_batch=2,
            draft_tokens=drafts,
        )
        for name, drafts in (("drafts", DRAFT_TOKENS), ("one_per_pass", 0))
    }
    schemas = dict(list(SCHEMAS.items())[:1]) if args.quick else SCHEMAS
    repeats = 1 if args.quick else args.repeats
    print(f"model float type {loaded.dtype}, {torch.get_num_threads()} thread(s)", flush=True)
    results: dict[str, Any] = {}
    try:
        for name, (schema, prompt) in schemas.items():
            table = cache.get(Constraint.json_schema(schema))
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            request = GenerationRequest(
                prompt_ids=tokenizer.encode(text),
                params=SamplingParams(max_tokens=args.max_tokens, temperature=0.0),
                constraint=PreparedConstraint.of(table),
            )
            runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
            for engine in arms.values():  # warm-up: prefix reuse, mask rows, drafts cache
                one(engine, request)
            for _ in range(repeats):
                for arm, engine in arms.items():
                    runs[arm].append(one(engine, request))
            results[name] = summarise(runs, table.min_tokens)
            r = results[name]
            print(
                f"{name:11s} min {table.min_tokens:3d}  tokens {r['tokens']:3d}  "
                f"tok/s {r['tok_s']['drafts']:6.1f} vs {r['tok_s']['one_per_pass']:6.1f}  "
                f"ratio {r['ratio']:.2f}  passes {r['passes']['drafts']} vs "
                f"{r['passes']['one_per_pass']} (saved {r['steps_saved']:.0%})  "
                f"forced share {r['forced_share']:.0%}  identical {r['identical']}",
                flush=True,
            )
    finally:
        for engine in arms.values():
            engine.shutdown()
    out = {
        "command": "python -m bench.drafts " + " ".join(argv if argv is not None else sys.argv[1:]),
        "dtype": str(loaded.dtype),
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "loadavg_after": os.getloadavg(),
        "schemas": results,
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


def summarise(runs: dict[str, list[dict[str, Any]]], min_tokens: int) -> dict[str, Any]:
    with_, without = runs["drafts"], runs["one_per_pass"]
    texts = {r["text"] for r in with_ + without}
    tok_s = {
        arm: statistics.median(r["tokens"] / r["wall_s"] for r in rs) for arm, rs in runs.items()
    }
    passes = {arm: rs[0]["passes"] for arm, rs in runs.items()}
    return {
        "min_tokens": min_tokens,
        "tokens": with_[0]["tokens"],
        "tok_s": tok_s,
        "tok_s_each": {arm: [r["tokens"] / r["wall_s"] for r in rs] for arm, rs in runs.items()},
        "ratio": tok_s["drafts"] / tok_s["one_per_pass"],
        "passes": passes,
        "steps_saved": 1 - passes["drafts"] / passes["one_per_pass"],
        "forced_share": with_[0]["kept"] / with_[0]["tokens"],
        "identical": len(texts) == 1,
        "text": with_[0]["text"],
    }


if __name__ == "__main__":
    main()
