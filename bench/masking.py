"""Mask computation: gclm's packed rows against outlines-core's Guide.write_mask_into.

    python -m bench.masking [--json PATH] [--tokenizer DIR] [--quick]

For B in {1, 8, 64}, at the embedded tokenizer's vocabulary (49,152) and at the same
vocabulary padded with synthetic tokens to 151,936 (logits 152,064, like Qwen2), on schemas
made mostly of free strings, with states taken from realistic walks (strings end after a
few tokens; the budget closes what is still open), it times per step and per sequence:

    (a) gclm: fill_bitmask for every row of the batch buffer
    (b) (a) plus apply_bitmask on the logits
    (c) outlines-core: Guide.write_mask_into for every row (forward-only)

Also: table bytes against the GCLM seed's dense S x V int64 tensor, and the per-step cost at
batch 8 of the transformers adapter (processor; processor plus stopping criterion) against a
forward-only outlines-core LogitsProcessor. Both apply masks with apply_bitmask: the difference
is mask computation and state tracking.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import outlines_core
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.compiler.whole.token_sets import unpack_row
from gclm.masking import (
    ConstraintState,
    allocate_bitmask,
    apply_bitmask,
    fill_bitmask,
    mask_table,
    num_words,
)
from gclm.masking.hf import HFConstraint

STR = {"type": "string"}


def obj(**props: Any) -> dict[str, Any]:
    """An object schema whose properties are all required."""
    return {"type": "object", "properties": props, "required": list(props)}


SCHEMAS = {
    "profile": obj(name=STR, email=STR, bio=STR, city=STR, company=STR, age={"type": "integer"}),
    "article": obj(
        title=STR,
        summary=STR,
        tags={"type": "array", "items": STR, "maxItems": 4},
        author=obj(name=STR, affiliation=STR),
    ),
}
PADDED_VOCAB, PADDED_LOGITS = 151_936, 152_064
BUDGET = 160  # max_tokens of a generous request; half the walks get a tight one instead
P_PROGRESS = 0.06  # chance per step of taking a token that brings acceptance closer


def load_vocab(tokenizer: str | None, synthetic: bool) -> tuple[TokenVocabulary, str]:
    """The vocabulary of `tokenizer` (a hub id or directory; None: the embedded model's), or,
    with `synthetic`, a GPT-2-like one of the same size made of random words."""
    if not synthetic:
        from gclm.server.engine.model_loader import load_tokenizer

        return TokenVocabulary.from_tokenizer(load_tokenizer(tokenizer)), "real"
    rng, words = np.random.default_rng(0), dict[bytes, None]()
    while len(words) < 49_152 - 3 - 256:  # random words, most with a leading space
        word = bytes(
            rng.choice(np.frombuffer(b"etaoinshrdlcumwfgyp", np.uint8), rng.integers(2, 9))
        )
        words[b" " + word if rng.random() < 0.6 else word] = None
    toks = [None] * 3 + [bytes([b]) for b in range(256)] + list(words)
    return TokenVocabulary(tuple(toks), 2, "byte_level"), "synthetic"


def pad_vocab(vocab: TokenVocabulary, size: int) -> TokenVocabulary:
    """The vocabulary plus synthetic tokens (pairs of real tokens) up to `size` ids."""
    rng = np.random.default_rng(1)
    real = [t for t in vocab.token_bytes if t and t.strip().isalpha()]
    toks = list(vocab.token_bytes)
    seen = set(toks)
    while len(toks) < size:
        word = real[rng.integers(len(real))] + real[rng.integers(len(real))].strip()
        if word not in seen:
            seen.add(word)
            toks.append(word)
    return TokenVocabulary(tuple(toks), vocab.eos_token_id, vocab.scheme)


Walk = tuple[list[int], int]  # (tokens ending with EOS, the request's max_tokens)


def sample_walk(table: CompiledTable, rng: np.random.Generator) -> Walk:
    """One budget-respecting output: uniform over allowed tokens, except that with
    probability P_PROGRESS it takes a token that brings acceptance closer. Ends with EOS.
    Half the requests are generous (BUDGET), half leave 10-60 tokens of slack, so that the
    budget bites near their end."""
    budget = BUDGET if rng.random() < 0.5 else table.min_tokens + int(rng.integers(10, 61))
    seq, out, left = ConstraintState(table), [], budget
    buf = allocate_bitmask(1, table.vocab_size)
    while not seq.must_stop(left):
        if seq.is_accepting and rng.random() < 0.5:
            break
        nexts, rows = table.groups(seq.state)
        closer = np.flatnonzero(table.dist[nexts] < seq.dist)
        if closer.size and rng.random() < P_PROGRESS:
            tokens = table.token_sets.tokens_of(int(rows[rng.choice(closer)]))
        else:
            fill_bitmask(buf, 0, seq, left)
            tokens = unpack_row(buf[0].numpy())
            tokens = tokens[tokens != table.eos_token_id]
        if not tokens.size:
            break
        tok = int(rng.choice(tokens))
        seq.advance(tok, left)
        out.append(tok)
        left -= 1
    return out + [table.eos_token_id], budget


class Row:
    """One sequence of the batch, replaying walks in both libraries in lockstep."""

    def __init__(self, table: CompiledTable, index: Any, walks: list[Walk], k: int):
        self.table, self.index, self.walks, self.k = table, index, walks, k
        self.restart()
        # A batch is a snapshot of sequences at different points of their outputs.
        skip = int(np.random.default_rng(k).integers(len(self.walk) - 1))
        for _ in range(skip):
            self.step()

    def restart(self) -> None:
        self.walk, self.budget = self.walks[self.k % len(self.walks)]
        self.k += 1
        self.pos = 0
        self.seq = ConstraintState(self.table)
        self.guide = outlines_core.Guide(self.index)

    @property
    def tokens_left(self) -> int:
        return self.budget - self.pos

    def step(self) -> None:
        tok = self.walk[self.pos]
        if tok == self.table.eos_token_id:
            self.restart()
            return
        self.seq.advance(tok)
        self.guide.advance(tok, return_tokens=False)
        self.pos += 1


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def bench_masks(
    table: CompiledTable, index: Any, walks: list[Walk], batch: int, steps: int
) -> dict[str, list[float]]:
    """Per-row and per-step timings (microseconds) of (a), (b) and (c)."""
    width = num_words(table.vocab_size)
    logits_cols = PADDED_LOGITS if table.vocab_size > 100_000 else table.vocab_size
    ours, theirs = (allocate_bitmask(batch, table.vocab_size) for _ in range(2))
    ptr, stride = theirs.data_ptr(), width * 4
    base = torch.randn(batch, logits_cols)  # [B, V_logits]
    logits, logits_gpu = base.clone(), base.cuda() if torch.cuda.is_available() else None
    rows = [Row(table, index, walks, k * 7) for k in range(batch)]
    keys = ("a_seq", "c_seq", "a_step", "b_step", "c_step", "string_rows", "b_cuda_step")
    out: dict[str, list[float]] = {k: [] for k in keys}
    clock = time.perf_counter_ns
    gc.collect()
    for _ in range(steps):
        a_total = c_total = 0
        for b, row in enumerate(rows):
            t0 = clock()
            fill_bitmask(ours, b, row.seq, row.tokens_left)
            dt = clock() - t0
            a_total += dt
            out["a_seq"].append(dt / 1e3)
        for b, row in enumerate(rows):
            t0 = clock()
            row.guide.write_mask_into(ptr + b * stride, width, 4)
            dt = clock() - t0
            c_total += dt
            out["c_seq"].append(dt / 1e3)
        # Rows allowing over half the vocabulary: positions inside a free string.
        allowed = np.unpackbits(ours.numpy().view(np.uint8), axis=1).sum(axis=1)  # [B]
        out["string_rows"] += (allowed > table.vocab_size // 2).astype(float).tolist()
        logits.copy_(base)
        t0 = clock()
        apply_bitmask(logits, ours)
        apply_ns = clock() - t0
        if logits_gpu is not None:
            # On the GPU: the copy of the pinned rows and the unpacking kernel, synchronised.
            torch.cuda.synchronize()
            t0 = clock()
            apply_bitmask(logits_gpu, ours)
            torch.cuda.synchronize()
            out["b_cuda_step"].append((a_total + clock() - t0) / 1e3)
        out["a_step"].append(a_total / 1e3)
        out["b_step"].append((a_total + apply_ns) / 1e3)
        out["c_step"].append(c_total / 1e3)
        for row in rows:
            row.step()
    return out


class OutlinesForwardProcessor(LogitsProcessor):
    """A forward-only outlines-core processor: one Guide per row, write_mask_into per row."""

    def __init__(self, index: Any, vocab_size: int, eos: int) -> None:
        self.index, self.vocab_size, self.eos = index, vocab_size, eos
        self.guides: list[Any] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if not self.guides:  # the first step: nothing generated yet
            self.guides = [outlines_core.Guide(self.index) for _ in range(input_ids.shape[0])]
            self.done = [False] * len(self.guides)
            self.mask = allocate_bitmask(len(self.guides), self.vocab_size)
        else:
            for b, tok in enumerate(input_ids[:, -1].tolist()):
                self.done[b] = self.done[b] or tok == self.eos
                if not self.done[b]:
                    self.guides[b].advance(tok, return_tokens=False)
        width, ptr = self.mask.shape[1], self.mask.data_ptr()
        for b, guide in enumerate(self.guides):
            guide.write_mask_into(ptr + b * width * 4, width, 4)
        apply_bitmask(scores, self.mask)
        return scores


def bench_processors(
    table: CompiledTable, index: Any, walks: list[Walk], batch: int = 8, runs: int = 3
) -> dict[str, list[float]]:
    """Per-step microseconds of the adapter and of the outlines-core processor, replaying
    the same walks as generate() would (finished rows get padding)."""
    eos = table.eos_token_id
    logits_cols = PADDED_LOGITS if table.vocab_size > 100_000 else table.vocab_size
    out: dict[str, list[float]] = {"gclm_proc": [], "gclm_proc_crit": [], "outlines_proc": []}
    clock = time.perf_counter_ns
    for run in range(runs):
        # Generous walks only: one generate() call has one max_new_tokens for the batch.
        generous = [w for w, budget in walks if budget == BUDGET]
        chosen = [generous[(run * batch + b) % len(generous)] for b in range(batch)]
        steps = max(len(w) for w in chosen)
        tokens = torch.tensor([w + [eos] * (steps - len(w)) for w in chosen])  # [B, T]
        ours = HFConstraint.from_table(table, BUDGET + 1)
        # Through a LogitsProcessorList, as generate() calls both.
        theirs = LogitsProcessorList([OutlinesForwardProcessor(index, table.vocab_size, eos)])
        ids = torch.full((batch, 12), 5, dtype=torch.long)  # [B, prompt]
        base = torch.randn(batch, logits_cols)
        for t in range(steps):
            s1, s2 = base.clone(), base.clone()
            t0 = clock()
            ours.logits_processor(ids, s1)
            t1 = clock()
            theirs(ids, s2)
            t2 = clock()
            ids = torch.cat([ids, tokens[:, t : t + 1]], dim=1)
            t3 = clock()
            ours.stopping_criteria(ids, s1)
            t4 = clock()
            out["gclm_proc"].append((t1 - t0) / 1e3)
            out["gclm_proc_crit"].append((t1 - t0 + t4 - t3) / 1e3)
            out["outlines_proc"].append((t2 - t1) / 1e3)
    return out


def build(schema: dict[str, Any], vocab: TokenVocabulary) -> tuple[Any, CompiledTable, float]:
    """outlines-core's Index for the compiler's regex of `schema`, and gclm's table for it
    (the same language, so a walk in one is a walk in the other)."""
    constraint = Constraint.json_schema(schema)
    t0 = time.perf_counter()
    index = outlines_core.Index(to_regex(constraint).regex, vocab.outlines)
    build_s = time.perf_counter() - t0
    return index, compile_constraint(constraint, vocab), build_s


def summarize(r: dict[str, list[float]], **labels: Any) -> dict[str, Any]:
    """p50 and p99 of each timing series, plus the share of rows inside strings."""
    case: dict[str, Any] = dict(labels)
    case["string_row_fraction"] = float(np.mean(r.pop("string_rows")))
    for key, xs in ((k, v) for k, v in r.items() if v):
        case[f"{key}_p50_us"], case[f"{key}_p99_us"] = pct(xs, 50), pct(xs, 99)
    c = case
    line = (
        f"  B={c['batch']:<3} per seq (a) {c['a_seq_p50_us']:5.2f} / {c['a_seq_p99_us']:6.2f}"
        f"  (c) {c['c_seq_p50_us']:6.2f} / {c['c_seq_p99_us']:6.2f}"
        f"  a/c {c['a_seq_p50_us'] / c['c_seq_p50_us']:.3f}"
        f" | per step (a) {c['a_step_p50_us']:6.1f}"
        f"  (b) {c['b_step_p50_us']:7.1f}  (c) {c['c_step_p50_us']:7.1f}"
        f" | in strings {c['string_row_fraction']:.0%}"
    )
    if "b_cuda_step_p50_us" in c:
        line += f" | (b) CUDA {c['b_cuda_step_p50_us']:.1f}"
    print(line)
    return case


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--tokenizer", help="hub id or directory (default: the embedded model's)")
    ap.add_argument("--synthetic", action="store_true", help="a random-word vocabulary instead")
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # per-sequence CPU work; one thread keeps the numbers steady

    base_vocab, kind = load_vocab(args.tokenizer, args.synthetic)
    vocabs = {"49k": base_vocab, "152k": pad_vocab(base_vocab, PADDED_VOCAB)}
    steps = {1: 400, 8: 80, 64: 16} if not args.quick else {1: 40, 8: 8, 64: 3}
    results: dict[str, Any] = {"vocab_kind": kind, "cases": [], "tables": []}
    seq: dict[tuple[str, str], list[float]] = {(v, k): [] for v in vocabs for k in "ac"}
    print(f"vocabulary: {kind}; times in microseconds (p50 / p99)")
    for vname, vocab in vocabs.items():
        for sname, schema in SCHEMAS.items():
            index, table, build_s = build(schema, vocab)
            # Walks are sampled on a twin table, so that the timed MaskTable starts cold.
            twin, rng = dataclasses.replace(table), np.random.default_rng(7)
            walks = [sample_walk(twin, rng) for _ in range(48)]
            masks = mask_table(table)
            dense, ours = table.num_states * vocab.size * 8, table.nbytes + masks.nbytes
            results["tables"].append(
                {
                    "vocab": vname,
                    "schema": sname,
                    "states": table.num_states,
                    "table_bytes": table.nbytes,
                    "mask_rows_bytes": masks.nbytes,
                    "dense_seed_bytes": dense,
                    "ratio": dense / ours,
                    "outlines_index_build_s": build_s,
                    "mean_walk_tokens": float(np.mean([len(w) - 1 for w, _ in walks])),
                }
            )
            print(
                f"\n[{vname} {sname}] S={table.num_states} forward rows={masks.num_rows} "
                f"table+rows={ours / 1e6:.2f} MB vs dense S*V*8={dense / 1e6:.1f} MB "
                f"({dense / ours:.0f}x)"
            )
            for batch, n in steps.items():
                r = bench_masks(table, index, walks, batch, n)
                seq[vname, "a"] += r["a_seq"]
                seq[vname, "c"] += r["c_seq"]
                results["cases"].append(summarize(r, vocab=vname, schema=sname, batch=batch))
            if sname == "profile":
                proc = bench_processors(table, index, walks, runs=3 if not args.quick else 1)
                summary = {k: (pct(v, 50), pct(v, 99)) for k, v in proc.items()}
                results[f"processor_b8_{vname}"] = summary
                print(
                    "  adapter per step at B=8: gclm processor {:.0f} / {:.0f}, + criteria "
                    "{:.0f} / {:.0f}; outlines-core processor {:.0f} / {:.0f}".format(
                        *summary["gclm_proc"], *summary["gclm_proc_crit"], *summary["outlines_proc"]
                    )
                )

    def ratio(*names: str) -> float:
        a = [x for v in names for x in seq[v, "a"]]
        c = [x for v in names for x in seq[v, "c"]]
        return pct(a, 50) / pct(c, 50)

    results["mask_ratio_p50"] = ratio("49k", "152k")
    a_all = [x for v in vocabs for x in seq[v, "a"]]
    c_all = [x for v in vocabs for x in seq[v, "c"]]
    results["mask_ratio_mean"] = float(np.mean(a_all) / np.mean(c_all))
    results["mask_ratio_p50_49k"] = ratio("49k")
    results["mask_ratio_p50_152k"] = ratio("152k")
    results["p50_us_152k"] = pct(seq["152k", "a"], 50)
    results["p99_us_152k"] = pct(seq["152k", "a"], 99)
    results["outlines_p99_us_152k"] = pct(seq["152k", "c"], 99)
    print(
        f"\nmask_ratio_p50 (a/c per sequence) = {results['mask_ratio_p50']:.4f} (49k "
        f"{results['mask_ratio_p50_49k']:.4f}, 152k {results['mask_ratio_p50_152k']:.4f}); "
        f"mean ratio {results['mask_ratio_mean']:.4f}; p99_us_152k = {results['p99_us_152k']:.2f} "
        f"(outlines-core {results['outlines_p99_us_152k']:.1f})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
