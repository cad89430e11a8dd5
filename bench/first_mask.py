"""Cold compile to the first usable mask: gclm, llguidance and XGrammar side by side, in-process.

    python -m bench.first_mask [--schemas DIR] [--limit N | --all | --slow MS]
                               [--vocab 49k 200k] [--steps N] [--json PATH]
                               [--engines gclm gclm-lazy gclm-grown llguidance xgrammar]

(--slow MS: instead of the first N, the schemas whose byte DFA took over MS to build at
200k in bench/results/lazy_reach_200k.json.)

For each schema of the MaskBench corpus (../shared/jsonschemabench, sorted by name: the first
60 are small BFCL function-call schemas) and each tokenizer (the embedded SmolLM2's 49,152
tokens, and o200k_base's 200k from bench/o200k.py), each engine in turn compiles the schema
from nothing and fills the start state's mask into a bitmask row: that is the time a request
with a new schema waits before its first token can be sampled. Per engine and tokenizer it
prints p50 / p90 / p99 over the schemas every engine compiled, the schemas refused, and the
200k / 49k ratio of the medians; for gclm also the bytes its table and mask table hold per
schema (what the compiled-table cache is charged).

Then, at 200k, the per-step cost of one sequence's mask: each engine walks the first valid
instance of a few schemas token by token, and at every step fills its mask row and applies
it to a [1, V] float32 CPU logits row, V the tokenizer's size (each engine's own fill and
apply calls). Medians of the per-step times are reported side by side.

Engines run the same way as in bench/maskbench.py: gclm's compile_constraint with the
server's state limit (in this process, no worker: the whole table, then its MaskTable),
gclm-lazy (compiler/grown/lazy_table.py: the byte DFA and the start state's walk only; later
states are walked as the step walk reaches them, inside its fill times), gclm-grown
(compiler/grown/lazy_dfa.py: the same LazyTable over a byte DFA determinized from the regex's NFA
as the walks read it, instead of outlines-core's whole byte DFA; as in the server, a regex
its parser refuses or an NFA over `MAX_GROWN_NFA_STATES` falls back to gclm-lazy's DFA,
counted in the summary as `fallbacks`), llguidance 1.9
LLMatcher (spec defaults), XGrammar with `any_whitespace=True, strict_mode=False`, one
thread, its cache off. Each engine's tokenizer data (gclm's token trie, llguidance's and
XGrammar's tokenizer objects) is built once before the timings, as a warm server has it.
llguidance and xgrammar are benchmark-only.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.jsonschemabench import DEFAULT_DIR

ENGINES = ("gclm", "gclm-lazy", "gclm-grown", "llguidance", "xgrammar")
VOCABS = ("49k", "200k")
FIRST_BUDGET = 4096  # max_tokens of the request the first mask is for


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; nan for no values."""
    return float(np.percentile(values, q)) if values else float("nan")


def load_tokenizer(vocab: str) -> Any:
    """The embedded model's tokenizer (49k) or o200k_base's (200k, built by bench/o200k.py)."""
    from gclm.server.engine.model_loader import load_tokenizer as load

    if vocab == "49k":
        return load(None)
    from bench.o200k import build

    return load(str(build()))


class Engine:
    """One engine over one tokenizer: compile a schema and fill its first mask."""

    def __init__(self, name: str, tokenizer: Any):
        self.name = name
        self.size = len(tokenizer)
        self.note: dict[str, Any] = {}  # what the last first_mask adds to its row
        if name in ("gclm", "gclm-lazy", "gclm-grown"):
            from gclm.compiler.vocab.trie import token_trie
            from gclm.compiler.vocab.vocabulary import TokenVocabulary
            from gclm.masking import allocate_bitmask

            self.vocab = TokenVocabulary.from_tokenizer(tokenizer)
            token_trie(self.vocab)
            self.bitmask = allocate_bitmask(1, self.vocab.size)
        elif name == "llguidance":
            import llguidance.hf
            import llguidance.torch

            self.lltok = llguidance.hf.from_tokenizer(tokenizer)
            self.bitmask = llguidance.torch.allocate_token_bitmask(1, self.lltok.vocab_size)
        elif name == "xgrammar":
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(tokenizer)
            self.xgr = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            self.bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        else:
            raise ValueError(f"unknown engine {name!r}; use one of {ENGINES}")

    def first_mask(self, schema: Any) -> Any:
        """Compile `schema` and fill the start state's mask; returns the matcher (gclm: the
        ConstraintState). Raises on a schema the engine refuses."""
        if self.name == "gclm":
            from gclm.compiler.front.constraint import Constraint
            from gclm.compiler.service.worker import CompileLimits
            from gclm.compiler.whole.compile import compile_constraint
            from gclm.masking import ConstraintState, fill_bitmask
            from gclm.masking.state import check_budget

            constraint = Constraint.json_schema(schema)
            table = compile_constraint(
                constraint, self.vocab, max_states=CompileLimits().max_states
            )
            check_budget(table, FIRST_BUDGET)
            state = ConstraintState(table)
            fill_bitmask(self.bitmask, 0, state, FIRST_BUDGET)
            return state
        if self.name == "gclm-lazy":
            from gclm.compiler.front.constraint import Constraint
            from gclm.compiler.front.regex import to_regex
            from gclm.compiler.grown.lazy_table import LazyTable
            from gclm.compiler.whole.byte_dfa import byte_dfa
            from gclm.masking import ConstraintState, fill_bitmask
            from gclm.masking.state import check_budget

            lazy = LazyTable(byte_dfa(to_regex(Constraint.json_schema(schema)).regex), self.vocab)
            check_budget(lazy, FIRST_BUDGET)
            state = ConstraintState(lazy)
            fill_bitmask(self.bitmask, 0, state, FIRST_BUDGET)
            return state
        if self.name == "gclm-grown":
            from gclm.compiler.front.constraint import Constraint
            from gclm.compiler.front.regex import to_regex
            from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
            from gclm.compiler.grown.lazy_table import LazyTable
            from gclm.compiler.grown.regex_parse import Unsupported
            from gclm.compiler.service.first_mask import MAX_GROWN_NFA_STATES
            from gclm.compiler.whole.byte_dfa import byte_dfa
            from gclm.masking import ConstraintState, fill_bitmask
            from gclm.masking.state import check_budget

            regex = to_regex(Constraint.json_schema(schema)).regex
            try:
                lazy: LazyTable = GrowingLazyTable.of_regex(regex, self.vocab, MAX_GROWN_NFA_STATES)
                self.note = {}
            except Unsupported as e:
                lazy = LazyTable(byte_dfa(regex), self.vocab)
                self.note = {"gclm-grown_fallback": str(e)}
            check_budget(lazy, FIRST_BUDGET)
            state = ConstraintState(lazy)
            fill_bitmask(self.bitmask, 0, state, FIRST_BUDGET)
            return state
        if self.name == "llguidance":
            import llguidance
            import llguidance.torch

            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
            matcher = llguidance.LLMatcher(self.lltok, grammar, log_level=0)
            if matcher.is_error():
                raise ValueError(matcher.get_error())
            llguidance.torch.fill_next_token_bitmask(matcher, self.bitmask, 0)
            if matcher.is_error():
                raise ValueError(matcher.get_error())
            return matcher
        import xgrammar as xgr

        compiled = self.xgr.compile_json_schema(
            json.dumps(schema), any_whitespace=True, strict_mode=False
        )
        matcher = xgr.GrammarMatcher(compiled)
        matcher.fill_next_token_bitmask(self.bitmask, 0)
        return matcher

    def table_bytes(self, matcher: Any) -> int | None:
        """gclm: bytes the compiled table and its mask table hold (the cache's charge);
        gclm-lazy, gclm-grown: what its LazyTable holds so far."""
        if self.name in ("gclm-lazy", "gclm-grown"):
            return int(matcher.masks.nbytes)
        if self.name != "gclm":
            return None
        from gclm.masking.masks import table_memory

        return int(table_memory(matcher.table))

    def step_costs(self, matcher: Any, tokens: list[int], logits: torch.Tensor) -> dict:
        """Per-step fill and apply seconds along `tokens` (a valid output), one row."""
        fills, applies = [], []
        left = FIRST_BUDGET
        for token in tokens:
            t0 = time.perf_counter()
            self._fill(matcher, left)
            t1 = time.perf_counter()
            self._apply(logits)
            t2 = time.perf_counter()
            fills.append(t1 - t0)
            applies.append(t2 - t1)
            self._advance(matcher, token, left)
            left -= 1
        return {"fill": fills, "apply": applies, "bytes": self.table_bytes(matcher)}

    def _fill(self, matcher: Any, left: int) -> None:
        if self.name.startswith("gclm"):
            from gclm.masking import fill_bitmask

            fill_bitmask(self.bitmask, 0, matcher, left)
        elif self.name == "llguidance":
            import llguidance.torch

            llguidance.torch.fill_next_token_bitmask(matcher, self.bitmask, 0)
        else:
            matcher.fill_next_token_bitmask(self.bitmask, 0)

    def _apply(self, logits: torch.Tensor) -> None:
        if self.name.startswith("gclm"):
            from gclm.masking import apply_bitmask

            apply_bitmask(logits, self.bitmask)
        elif self.name == "llguidance":
            import llguidance.torch

            llguidance.torch.apply_token_bitmask_inplace(logits, self.bitmask)
        else:
            import xgrammar as xgr

            xgr.apply_token_bitmask_inplace(logits, self.bitmask)

    def _advance(self, matcher: Any, token: int, left: int) -> None:
        if self.name.startswith("gclm"):
            matcher.advance(token, left)
        elif self.name == "llguidance":
            if not matcher.consume_token(token):
                raise ValueError(f"llguidance refused token {token}")
        elif not matcher.accept_token(token):
            raise ValueError(f"xgrammar refused token {token}")


def schema_files(directory: Path, limit: int | None) -> list[Path]:
    """The corpus's files sorted by name, the first `limit` (None: all)."""
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise SystemExit(f"No schemas in {directory}; pass --schemas DIR.")
    return paths[:limit]


def warm_up(engines: dict[str, Engine]) -> None:
    """One compile per engine before the timings: numba's cached code, lazy imports."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    for engine in engines.values():
        engine.first_mask(schema)


def time_first_masks(
    engines: dict[str, Engine], paths: list[Path], partial: Path | None = None
) -> list[dict[str, Any]]:
    """Per schema, each engine's seconds to its first mask (None: refused, with the error).
    Every 20 schemas the rows so far are written to `partial` (when given)."""
    rows: list[dict[str, Any]] = []
    for i, path in enumerate(paths):
        schema = json.loads(path.read_text())["schema"]
        row: dict[str, Any] = {"schema": path.name}
        for name, engine in engines.items():
            gc.collect()
            started = time.perf_counter()
            try:
                matcher = engine.first_mask(schema)
            except Exception as e:  # noqa: BLE001 - a refusal is a result here
                row[name] = None
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                continue
            row[name] = time.perf_counter() - started
            row.update(engine.note)
            nbytes = engine.table_bytes(matcher)
            if nbytes is not None:
                row[f"{name}_bytes"] = nbytes
        rows.append(row)
        if (i + 1) % 20 == 0:
            print(f"  {i + 1}/{len(paths)} schemas", flush=True)
            if partial is not None:
                partial.write_text(json.dumps(rows, indent=1))
    return rows


def summarize(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """p50/p90/p99 in ms over the schemas every engine compiled; refusals per engine."""
    both = [r for r in rows if all(r.get(n) is not None for n in names)]
    out: dict[str, Any] = {"schemas": len(rows), "compiled_by_all": len(both)}
    for name in names:
        ms = [r[name] * 1e3 for r in both]
        out[name] = {
            "p50_ms": percentile(ms, 50),
            "p90_ms": percentile(ms, 90),
            "p99_ms": percentile(ms, 99),
            "refused": sum(r.get(name) is None for r in rows),
        }
        sizes = [r[f"{name}_bytes"] for r in rows if f"{name}_bytes" in r]
        if sizes:
            out[name]["bytes_p50"] = percentile(sizes, 50)
            out[name]["bytes_p90"] = percentile(sizes, 90)
            out[name]["bytes_max"] = max(sizes)
    fallbacks = sum("gclm-grown_fallback" in r for r in rows)
    if "gclm-grown" in names:
        out["gclm-grown"]["fallbacks"] = fallbacks
    return out


def step_costs(engines: dict[str, Engine], paths: list[Path], tokenizer: Any, count: int) -> dict:
    """Median per-step fill and apply microseconds at this vocabulary, per engine, along the
    first valid instance of the first `count` schemas that every engine compiles."""
    # [1, V]: the tokenizer's own width, so that every engine masks the same columns.
    logits = torch.randn(1, max(e.size for e in engines.values()))
    per: dict[str, dict[str, list[float]]] = {
        n: {"fill": [], "apply": [], "bytes": []} for n in engines
    }
    used = 0
    for path in paths:
        if used == count:
            break
        data = json.loads(path.read_text())
        valid = [t["data"] for t in data.get("tests", []) if t.get("valid")]
        if not valid:
            continue
        tokens = tokenizer.encode(json.dumps(valid[0]), add_special_tokens=False)
        try:
            results = {}
            for name, engine in engines.items():
                matcher = engine.first_mask(data["schema"])
                results[name] = engine.step_costs(matcher, tokens, logits.clone())
        except Exception:  # noqa: BLE001 - a schema or instance one engine refuses: skip it
            continue
        used += 1
        for name, costs in results.items():
            per[name]["fill"] += costs["fill"]
            per[name]["apply"] += costs["apply"]
            if costs["bytes"] is not None:
                per[name]["bytes"].append(costs["bytes"])
    return {
        "schemas": used,
        "steps": len(per[next(iter(per))]["fill"]),
        **{
            name: {
                "fill_us": statistics.median(c["fill"]) * 1e6 if c["fill"] else None,
                "apply_us": statistics.median(c["apply"]) * 1e6 if c["apply"] else None,
                "fill_us_p99": percentile([f * 1e6 for f in c["fill"]], 99),
                "bytes_after_walk": c["bytes"],
            }
            for name, c in per.items()
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--all", action="store_true", help="every schema (overrides --limit)")
    parser.add_argument("--slow", type=float, metavar="MS", help="see the module docstring")
    parser.add_argument("--vocab", nargs="+", choices=VOCABS, default=list(VOCABS))
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--steps", type=int, default=5, help="schemas walked for step costs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    paths = schema_files(args.schemas, None if args.all or args.slow else args.limit)
    if args.slow:
        reach = json.loads(Path("bench/results/lazy_reach_200k.json").read_text())["schemas"]
        slow = {f"{r['name']}.json" for r in reach if r.get("dfa_ms", 0) > args.slow}
        paths = [p for p in paths if p.name in slow]
    result: dict[str, Any] = {
        "bench": "first_mask",
        "machine": f"{platform.processor() or platform.machine()}, shared 2-core host",
        "schemas_dir": str(args.schemas),
        "num_schemas": len(paths),
        "slow_ms": args.slow,
        "engines": args.engines,
        "first_budget": FIRST_BUDGET,
        "vocabs": {},
    }
    for vocab in args.vocab:
        tokenizer = load_tokenizer(vocab)
        engines = {name: Engine(name, tokenizer) for name in args.engines}
        warm_up(engines)
        print(f"{vocab} ({len(tokenizer)} tokens): {len(paths)} schemas", flush=True)
        partial = args.json.with_suffix(f".{vocab}.partial.json") if args.json else None
        rows = time_first_masks(engines, paths, partial)
        summary = summarize(rows, args.engines)
        entry: dict[str, Any] = {"size": len(tokenizer), "summary": summary, "rows": rows}
        if vocab == "200k" and args.steps:
            entry["steps"] = step_costs(engines, paths, tokenizer, args.steps)
        result["vocabs"][vocab] = entry
        print_summary(vocab, entry)
    if "49k" in result["vocabs"] and "200k" in result["vocabs"]:
        small, big = result["vocabs"]["49k"]["summary"], result["vocabs"]["200k"]["summary"]
        growth = {n: big[n]["p50_ms"] / small[n]["p50_ms"] for n in args.engines}
        result["growth_200k_over_49k"] = growth
        print(
            "200k / 49k at p50: "
            + ", ".join(f"{n} {r:.2f}x" for n, r in result["growth_200k_over_49k"].items())
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return result


def print_summary(vocab: str, entry: dict[str, Any]) -> None:
    summary = entry["summary"]
    print(f"{vocab}: first mask, ms over the {summary['compiled_by_all']} schemas all compiled")
    for name in summary:
        if not isinstance(summary[name], dict):
            continue
        s = summary[name]
        line = (
            f"  {name:11s} p50 {s['p50_ms']:8.2f}  p90 {s['p90_ms']:8.2f}  p99 {s['p99_ms']:8.2f}"
            f"  refused {s['refused']}"
        )
        if "bytes_p50" in s:
            mb = s["bytes_p50"] / 1e6, s["bytes_max"] / 1e6
            line += f"  table bytes p50 {mb[0]:.2f} MB max {mb[1]:.2f} MB"
        print(line)
    steps = entry.get("steps")
    if steps:
        n, used = steps["steps"], steps["schemas"]
        print(f"  per step at {vocab}, one sequence ({n} steps, {used} schemas):")
        for name, c in steps.items():
            if isinstance(c, dict) and c["fill_us"] is not None:
                print(f"    {name:11s} fill {c['fill_us']:7.1f} us  apply {c['apply_us']:7.1f} us")


if __name__ == "__main__":
    main()
