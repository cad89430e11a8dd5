"""What penalties, logit_bias and logprobs cost per decode step, against the step itself.

    python -m bench.sampling [--json PATH] [--quick]

On the embedded model (CPU, one intra-op thread, as the engine runs it on two cores), for
B in {1, 8}, with 256-token prompts and 128 tokens already generated per row, it times per
step (microseconds, median over the steps):

    (m) the model's batched decode forward (the step's main cost)
    (s) sample() over the batch (temperature 1)
    (p) apply_penalties with every row penalised: presence, frequency, repetition and a
        16-token logit_bias (the worst case; rows without penalties cost nothing)
    (l) token_logprobs with top_logprobs=20 for every row
    (hf) the baseline for (p): transformers' RepetitionPenaltyLogitsProcessor alone, on the
        same rows (it has no presence/frequency penalty nor logit_bias)

and prints (p + l) / m, the share the new work adds to a decode step, and p / hf.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import RepetitionPenaltyLogitsProcessor

from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.server.engine.logprobs import TokenNames, token_logprobs
from gclm.server.engine.model_loader import load_model
from gclm.server.engine.protocol import GenerationRequest, SamplingParams
from gclm.server.engine.transformers.kv_store import KVStore
from gclm.server.engine.transformers.penalties import apply_penalties
from gclm.server.engine.transformers.sampling import sample

PROMPT, GENERATED = 256, 128


@dataclass
class Row:
    request: GenerationRequest
    output_ids: list[int]
    generator: torch.Generator | None = None


def rows(batch: int, vocab: int, penalised: bool) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(batch):
        prompt = torch.randint(0, vocab, (PROMPT,), generator=g).tolist()
        output = torch.randint(0, vocab, (GENERATED,), generator=g).tolist()
        params = SamplingParams(
            max_tokens=1024,
            logprobs=20,
            **(
                {
                    "presence_penalty": 0.5,
                    "frequency_penalty": 0.5,
                    "repetition_penalty": 1.2,
                    "logit_bias": tuple((t, 1.0) for t in range(16)),
                }
                if penalised
                else {}
            ),
        )
        out.append(Row(GenerationRequest(prompt_ids=prompt, params=params), output))
    return out


def median_us(fn: Callable[[], Any], steps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def bench(model: Any, names: TokenNames, batch: int, steps: int) -> dict[str, float]:
    vocab = model.config.vocab_size
    batch_rows = rows(batch, vocab, penalised=True)
    prompts = [r.request.prompt_ids for r in batch_rows]
    kv = KVStore(model, batch)
    slots = [kv.claim(p) for p in prompts]
    logits = kv.extend(dict(zip(slots, prompts, strict=True))).float()
    last = {slot: [0] for slot in slots}

    def decode() -> None:
        kv.extend(last)

    tokens = sample(logits, batch_rows)
    hf = RepetitionPenaltyLogitsProcessor(1.2)
    seen = torch.tensor([r.request.prompt_ids + r.output_ids for r in batch_rows])
    result = {
        "m": median_us(decode, steps),
        "s": median_us(lambda: sample(logits, batch_rows), steps * 4),
        "p": median_us(lambda: apply_penalties(logits.clone(), batch_rows), steps * 4),
        "l": median_us(lambda: token_logprobs(logits, tokens, batch_rows, names), steps * 4),
        "hf": median_us(lambda: hf(seen, logits.clone()), steps * 4),
        "clone": median_us(lambda: logits.clone(), steps * 4),
    }
    # Both penalty timings include one clone of the logits (so each starts from the same
    # values); take it out of both.
    result["p"] -= result["clone"]
    result["hf"] -= result["clone"]
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    loaded = load_model(None, device="cpu")
    tokenizer = loaded.tokenizer
    names = TokenNames(TokenVocabulary.from_tokenizer(tokenizer).token_bytes, str)
    steps = 5 if args.quick else 30
    results: dict[str, Any] = {"model": loaded.model_id, "prompt": PROMPT, "cases": []}
    print(f"{loaded.model_id}, CPU, 1 thread; per step, microseconds (median)")
    for batch in (1, 8):
        r = bench(loaded.model, names, batch, steps)
        share = (r["p"] + r["l"]) / r["m"]
        ratio = r["p"] / r["hf"]
        results["cases"].append({"batch": batch, **r, "share_of_step": share, "p_over_hf": ratio})
        print(
            f"  B={batch}: forward (m) {r['m']:.0f}  sample (s) {r['s']:.0f}  "
            f"penalties (p) {r['p']:.0f}  logprobs k=20 (l) {r['l']:.0f}  "
            f"HF repetition only (hf) {r['hf']:.0f} | (p+l)/m {share:.3f}  p/hf {ratio:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
