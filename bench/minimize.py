"""DFA minimization: the whole compile with it and without it, side by side, in process.

    python -m bench.minimize [--vocab 49k|200k] [--half tune|report|all] [--limit N]
                             [--max-states N] [--json PATH]

For each MaskBench schema of ../shared/jsonschemabench (bench/maskbench.py's order and
halves), the regex is written once, then the whole table is compiled twice, the two in
alternating order from one schema to the next: over the minimal byte DFA (what
compile_constraint does) and over the DFA as outlines-core builds it (the code before
compiler/whole/minimize.py). Per variant: the table's states, the whole compile (DFA build,
minimization, token walk, distances and pruning) and the table's bytes. A schema whose
DFA as built has more than --max-states states is left out of both (reported): one compile
of those takes minutes here. Refusals (unsupported, over the limits) are counted.
Medians and the median per-schema ratio are printed; --json writes every row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.first_mask import load_tokenizer
from bench.maskbench import DEFAULT_SCHEMAS, select
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.service.progress import Reporter
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import byte_dfa
from gclm.compiler.whole.compile import BuiltDfa, table_from_dfa
from gclm.errors import GclmError

VARIANTS = ("minimal", "as_built")


def compile_once(regex: str, vocab: TokenVocabulary, minimal: bool) -> dict[str, Any]:
    started = time.perf_counter()
    built = BuiltDfa(byte_dfa(regex), (), len(regex))
    table = table_from_dfa(built, vocab, started, Reporter(None), minimal=minimal)
    return {
        "states": table.num_states,
        "total_s": time.perf_counter() - started,
        "table_bytes": table.nbytes,
        "min_tokens": table.min_tokens,
    }


def run_schema(path: Path, vocab: TokenVocabulary, flip: bool, max_states: int) -> dict[str, Any]:
    row: dict[str, Any] = {"schema": path.name}
    try:
        regex = to_regex(Constraint.json_schema(json.loads(path.read_text())["schema"])).regex
        states = byte_dfa(regex).next.shape[0]
    except (GclmError, ValueError, RuntimeError, OverflowError) as e:
        return {**row, "refused": type(e).__name__}
    if states > max_states:
        return {**row, "left_out": states}
    order = VARIANTS[::-1] if flip else VARIANTS
    try:
        for name in order:
            row[name] = compile_once(regex, vocab, name == "minimal")
    except GclmError as e:
        return {**row, "refused": type(e).__name__}
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    both = [r for r in rows if all(v in r for v in VARIANTS)]
    out: dict[str, Any] = {
        "schemas": len(rows),
        "compiled": len(both),
        "refused": sum("refused" in r for r in rows),
        "left_out": sum("left_out" in r for r in rows),
    }
    if not both:
        return out
    for key in ("states", "total_s", "table_bytes"):
        for v in VARIANTS:
            values = sorted(r[v][key] for r in both)
            out[f"{v}_{key}_p50"] = values[len(values) // 2]
            out[f"{v}_{key}_p90"] = values[int(len(values) * 0.9)]
        out[f"{key}_ratio_median"] = round(
            statistics.median(r["minimal"][key] / max(r["as_built"][key], 1e-9) for r in both), 3
        )
    out["same_min_tokens"] = all(
        r["minimal"]["min_tokens"] == r["as_built"]["min_tokens"] for r in both
    )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", choices=("49k", "200k"), default="49k")
    parser.add_argument("--half", choices=("tune", "report", "all"), default="all")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-states", type=int, default=30_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(args.vocab))
    compile_once('"a"', vocab, True)  # numba's compiled code loaded before the first schema
    rows = []
    for i, path in enumerate(select(DEFAULT_SCHEMAS, args.half, None, args.limit)):
        row = run_schema(path, vocab, i % 2 == 1, args.max_states)
        rows.append(row)
        got = {
            v: f"{row[v]['states']} states {row[v]['total_s']:.3f}s" for v in VARIANTS if v in row
        }
        print(f"[{i + 1}] {path.name}: {got or row}", flush=True)
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summarize(rows),
        "rows": rows,
    }
    print(json.dumps(result["summary"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
