"""Engine throughput and mask cost on an accelerator, side by side with plain generate().

    python -m bench.gpu --model-dir DIR [--random-weights] [--device cuda] [--json PATH]

DIR holds a model (config, tokenizer, and weights unless --random-weights). With
--random-weights the model is built from DIR's config with random weights: tokens/s and
mask costs are the same as the real model's, output quality is not (the constrained arm
still checks that every output is valid). For each concurrency it measures, in one run:

- (a) constrained requests (JSON Schema) through the engine,
- (b) unconstrained requests through the engine, same prompts and max_tokens,
- (c) sequential `model.generate()` on the same prompts (the baseline),

and prints output tokens/s, the ratios a/b and b/c, and apply_bitmask's cost per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch

from gclm.compiler.cache import TableCache
from gclm.compiler.compile import compile_constraint
from gclm.compiler.constraint import Constraint
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.masking import allocate_bitmask, apply_bitmask
from gclm.server.engine.protocol import FinishEvent, GenerationRequest, SamplingParams
from gclm.server.engine.transformers.engine import BatchEngine

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "array", "items": {"type": "integer"}, "maxItems": 5},
        },
        "required": ["city", "unit", "days"],
    },
]
PROMPTS = [
    "Invent a person and answer in JSON.",
    "Describe tomorrow's weather in Paris as JSON.",
    "Give me a shopping list.",
    "Write a haiku about the sea.",
]


def load(model_dir: Path, random_weights: bool, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if random_weights:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


async def engine_arm(engine, prompts, tables, max_tokens, concurrency):
    """Run every prompt (with its table, or none) at the given concurrency; tokens/s."""
    sem = asyncio.Semaphore(concurrency)
    tokens, outputs = 0, []

    async def one(prompt, table):
        nonlocal tokens
        async with sem:
            ids = engine.encode_prompt(engine.render_chat([{"role": "user", "content": prompt}]))
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
            handle = engine.submit(GenerationRequest(ids, params, table=table))
            text = ""
            async for event in engine.stream(handle):
                if isinstance(event, FinishEvent):
                    tokens += event.completion_tokens
                elif hasattr(event, "text"):
                    text += event.text
                else:
                    raise RuntimeError(event)
            outputs.append((text, table))

    started = time.perf_counter()
    await asyncio.gather(*(one(p, t) for p, t in zip(prompts, tables, strict=True)))
    wall = time.perf_counter() - started
    # Outputs of unequal length make tokens/s alone misleading when one wave fills the
    # batch: the wave lasts as long as its longest output. Report the mean length too.
    return tokens / wall, outputs, tokens / len(prompts)


def generate_arm(model, tokenizer, prompts, max_tokens, device):
    tokens, started = 0, time.perf_counter()
    for prompt in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        inputs = tokenizer(text, return_tensors="pt").to(device)
        out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
        tokens += out.shape[1] - inputs["input_ids"].shape[1]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - started)


def mask_cost(vocab_size: int, device: str, batch: int, steps: int = 200) -> float:
    """Median µs per step to copy a packed bitmask to the device and apply it."""
    logits = torch.randn(batch, vocab_size, device=device)
    bitmask = allocate_bitmask(batch, vocab_size)
    bitmask.fill_(0x5555)
    times = []
    for _ in range(steps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t = time.perf_counter()
        apply_bitmask(logits, bitmask)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(
        args.dtype, torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    )
    model, tokenizer = load(args.model_dir, args.random_weights, args.device, dtype)
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    cache = TableCache(lambda c: compile_constraint(c, vocab), vocab.fingerprint)
    tables = [cache.get(Constraint.json_schema(s)) for s in SCHEMAS]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    constrained = [tables[i % len(tables)] for i in range(args.requests)]
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    report: dict = {"device": device_name, "dtype": str(dtype), "max_tokens": args.max_tokens}

    async def run_engine():
        rows = {}
        for c in args.concurrency:
            engine = BatchEngine(
                model, tokenizer, model_id="bench", vocab=vocab, cache=cache, max_batch=c
            )
            try:
                await engine_arm(engine, prompts[:2], constrained[:2], args.max_tokens, c)  # warm
                a, outs, a_len = await engine_arm(engine, prompts, constrained, args.max_tokens, c)
                unconstrained = [None] * len(prompts)
                b, _, b_len = await engine_arm(engine, prompts, unconstrained, args.max_tokens, c)
            finally:
                engine.shutdown()
            invalid = sum(1 for text, _ in outs if not _valid_json(text))
            rows[c] = {
                "constrained_tps": a,
                "unconstrained_tps": b,
                "constrained_mean_tokens": a_len,
                "unconstrained_mean_tokens": b_len,
                "invalid_outputs": invalid,
            }
        return rows

    report["engine"] = asyncio.run(run_engine())
    n_base = min(args.requests, 8)
    report["generate_tps"] = generate_arm(
        model, tokenizer, prompts[:n_base], args.max_tokens, args.device
    )
    report["mask_apply_us"] = {
        f"B{b}_V{v}": mask_cost(v, args.device, b) for b in (1, 8, 64) for v in (49152, 151936)
    }
    base = report["generate_tps"]
    print(f"device {device_name}, dtype {dtype}, max_tokens {args.max_tokens}")
    print(f"sequential generate(): {base:8.1f} tok/s")
    print("concurrency  constrained  unconstrained  a/b    b/generate  invalid  mean tokens a/b")
    for c, r in report["engine"].items():
        r["constrained_ratio"] = r["constrained_tps"] / r["unconstrained_tps"]
        r["batching_speedup"] = r["unconstrained_tps"] / base
        print(
            f"{c:11d}  {r['constrained_tps']:11.1f}  {r['unconstrained_tps']:13.1f}  "
            f"{r['constrained_ratio']:.2f}   {r['batching_speedup']:9.2f}  "
            f"{r['invalid_outputs']:7d}"
            f"  {r['constrained_mean_tokens']:.1f}/{r['unconstrained_mean_tokens']:.1f}"
        )
    for k, v in report["mask_apply_us"].items():
        print(f"apply_bitmask {k}: {v:.1f} µs/step")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _valid_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


if __name__ == "__main__":
    main()
