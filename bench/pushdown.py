"""Recursion: gclm's pushdown masks beside llguidance's, same grammars and tokenizer.

    python -m bench.pushdown [--json PATH] [--steps 48] [--repeats 3]

For each Lark grammar (rules that recurse inside their alternatives) and JSON Schema (a
`$ref` that leads back to itself), no depth cap on either side:

- first mask: a new grammar's first mask (gclm: frames, the NFA, the first walk; llguidance:
  grammar_from_lark or grammar_from_json_schema, an LLMatcher, its first bitmask), and a
  cached one's (gclm: the row of a table already made; llguidance: a new matcher of a
  grammar already parsed, its bitmask);
- per step at batch 8 and 64: B sequences generate with random choices pushed toward the
  opening token (so that they nest deep, where a regex unrolled 3 deep stops), each
  through gclm's masks with its budget; the time to fill the B rows of a bitmask per
  step. llguidance replays the same tokens: a matcher per row, `fill_next_token_bitmask`
  per row, then `consume_token`. Tokens llguidance rejects are counted: gclm's outputs
  parse with Lark's Earley parser (tests/compiler/front/grammar/test_pushdown_grammars.py);
  llguidance's lexer differs on some (runs of `%ignore`d whitespace, long `-` chains).

Beside them, "regular": the same grammar or schema with its recursion unrolled 3 deep into
one regex (as gclm served it before the stack), a fresh grown table generated the same way,
its own outputs (they nest 3 deep at most): the cost of a regular constraint's step.

Medians over the steps and the repeats; prints gclm / llguidance and gclm / regular ratios,
writes JSON.

`--http`: instead, one `gclm serve` (embedded model, defaults), and per grammar and schema
a streamed /v1/completions sent twice on the idle server, closed at its first token: the
first time the server has not seen the constraint, the second time its table is cached
(bench/first_mask_http.py's method). Reported: the new one's first token minus the cached
one's, p50 over the grammars and schemas; and the same for each grammar as a custom tool's
input on /v1/chat/completions (named tool_choice), to the call's first streamed piece (its
prompt holds the grammar, so the new one's prompt is new too), beside the request's wait for
its constraint (the server's gclm_compile_seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

GRAMMARS = {
    "lists": (
        'start: value\nvalue: "[" (value ("," value)*)? "]" | DIGIT\n%import common.DIGIT',
        "[",
    ),
    "calls": ('start: e\ne: "f(" e ("," e)* ")" | INT\n%import common.INT', "f("),
    "arithmetic": (
        """start: sum
sum: product (("+"|"-") product)*
product: atom ("*" atom)*
atom: INT | "(" sum ")" | "-" atom
%import common.INT
%import common.WS
%ignore WS""",
        "(",
    ),
    "json": (
        r"""start: value
value: dict | list | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
list: "[" [value ("," value)*] "]"
dict: "{" [pair ("," pair)*] "}"
pair: ESCAPED_STRING ":" value
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS""",
        "[",
    ),
    "sql_subqueries": (
        """start: query
query: "SELECT " cols " FROM " source (" WHERE " cond)?
cols: NAME (", " NAME)*
source: NAME | "(" query ")"
cond: NAME " = " value | cond " AND " cond | "(" cond ")"
value: INT | "(" query ")"
NAME: /[a-z]{1,8}/
%import common.INT""",
        "(",
    ),
    # JSON Schemas whose $refs recurse (a dict: the schema; gclm's frames from
    # compiler/front/json_schema/frames.py, llguidance's grammar_from_json_schema).
    "schema_tree": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 8},
                "kids": {"type": "array", "items": {"$ref": "#"}},
            },
            "required": ["name", "kids"],
        },
        "{[",
    ),
    "schema_lists": (
        {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]},
        "[",
    ),
    "s_expressions": (
        """start: sexp
sexp: ATOM | "(" sexp (" " sexp)* ")"
ATOM: /[a-z0-9]{1,6}/""",
        "(",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--steps", type=int, default=48, help="tokens each sequence generates")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--http", action="store_true", help="first tokens over HTTP instead")
    args = parser.parse_args()
    if args.http:
        _http(args.json)
        return

    import llguidance
    import llguidance.hf

    from gclm.compiler.vocab.vocabulary import TokenVocabulary
    from gclm.server.engine.model_loader import load_tokenizer

    tokenizer = load_tokenizer(None)
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    lltok = llguidance.hf.from_tokenizer(tokenizer)
    _warm(vocab, lltok)
    results: dict[str, Any] = {"vocab_size": vocab.size, "grammars": {}}
    print(f"{'grammar':16} {'first new/cached ms (gclm)':>27} {'(llg)':>14}", end="")
    print(f" {'step b8 ms gclm/llg/regular':>30} {'step b64 ms gclm/llg/regular':>30} {'depth':>6}")
    for name, (grammar, opener) in GRAMMARS.items():
        row = _one(name, grammar, opener, vocab, lltok, args.steps, args.repeats)
        results["grammars"][name] = row
        print(
            f"{name:16} {row['gclm_first_new_ms']:12.2f} / {row['gclm_first_cached_ms']:6.3f}"
            f"{row['llg_first_new_ms']:8.2f} / {row['llg_first_cached_ms']:5.2f}"
            f"{row['gclm_step_ms'][8]:10.2f} / {row['llg_step_ms'][8]:6.2f}"
            f" / {row['regular_step_ms'][8]:6.2f}"
            f"{row['gclm_step_ms'][64]:10.2f} / {row['llg_step_ms'][64]:6.2f}"
            f" / {row['regular_step_ms'][64]:6.2f}"
            f"{row['deepest']:6d}"
        )
    rows = results["grammars"].values()
    summary = {
        "gclm_first_extra_ms_p50": statistics.median(
            r["gclm_first_new_ms"] - r["gclm_first_cached_ms"] for r in rows
        ),
        "step_ratio_b8_median": statistics.median(
            r["gclm_step_ms"][8] / r["llg_step_ms"][8] for r in rows
        ),
        "step_ratio_b64_median": statistics.median(
            r["gclm_step_ms"][64] / r["llg_step_ms"][64] for r in rows
        ),
        "regular_ratio_b8_median": statistics.median(
            r["gclm_step_ms"][8] / r["regular_step_ms"][8] for r in rows
        ),
        "regular_ratio_b64_median": statistics.median(
            r["gclm_step_ms"][64] / r["regular_step_ms"][64] for r in rows
        ),
        "llg_rejected_tokens": sum(r["llg_rejected"] for r in rows),
    }
    results["summary"] = summary
    print(
        f"new grammar's first mask: p50 {summary['gclm_first_extra_ms_p50']:.1f} ms more than a "
        f"cached one's; step gclm/llguidance: b8 {summary['step_ratio_b8_median']:.2f}x, "
        f"b64 {summary['step_ratio_b64_median']:.2f}x; gclm's stack / its regular (unrolled) "
        f"table: b8 {summary['regular_ratio_b8_median']:.2f}x, "
        f"b64 {summary['regular_ratio_b64_median']:.2f}x (medians over grammars); tokens "
        f"llguidance rejected: {summary['llg_rejected_tokens']}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


def _http(out: Path | None) -> None:
    import httpx

    from bench._server import GclmServer
    from bench.first_mask_http import GCLM_BUSY, wait_idle

    def first_token(client: httpx.Client, grammar: Any, tool: bool = False) -> float:
        payload: dict[str, Any] = {"prompt": "Nested: ", "max_tokens": 64, "stream": True}
        path, first = "/v1/completions", '"text":"'
        if tool:  # a custom tool's input in the grammar: its call's first piece
            path, first = "/v1/chat/completions", '"tool_calls"'
            custom = {"name": "nest", "format": {"type": "grammar", "grammar": {
                "syntax": "lark", "definition": grammar}}}  # fmt: skip
            del payload["prompt"]
            payload |= {
                "messages": [{"role": "user", "content": "Nest."}],
                "tools": [{"type": "custom", "custom": custom}],
                "tool_choice": {"type": "custom", "custom": {"name": "nest"}},
            }
        elif isinstance(grammar, dict):
            payload["guided_json"] = grammar
        else:
            payload["structured_outputs"] = {"grammar": grammar}
        wait_idle(client, GCLM_BUSY)
        started = time.perf_counter()
        with client.stream("POST", path, json=payload) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:200]!r}")
            for line in response.iter_lines():
                compact = line.replace(" ", "")
                if line.startswith("data: {") and first in compact and '"text":""' not in compact:
                    return time.perf_counter() - started
        raise RuntimeError("the stream ended without a token")

    def waited_for_constraints(client: httpx.Client) -> float:
        """The server's gclm_compile_seconds sum: every request's wait for its constraint."""
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("gclm_compile_seconds_sum"):
                return float(line.split()[-1])
        raise RuntimeError("no gclm_compile_seconds_sum in /metrics")

    rows: dict[str, Any] = {}
    with GclmServer() as server, httpx.Client(base_url=server.url, timeout=120) as client:
        first_token(client, 'start: t\nt: "(" t ")" | "x"')  # warm
        for name, (grammar, _) in GRAMMARS.items():
            fresh = _fresh(grammar, 99)
            new = first_token(client, fresh)
            cached = first_token(client, fresh)
            rows[name] = {"new_ms": 1e3 * new, "cached_ms": 1e3 * cached}
            print(f"{name:16} new {1e3 * new:7.1f} ms  cached {1e3 * cached:7.1f} ms")
        for name, (grammar, _) in GRAMMARS.items():
            if isinstance(grammar, dict):
                continue
            fresh = _fresh(grammar, 98)
            waited = waited_for_constraints(client)
            new = first_token(client, fresh, tool=True)
            wait_new = waited_for_constraints(client) - waited
            cached = first_token(client, fresh, tool=True)
            wait_cached = waited_for_constraints(client) - waited - wait_new
            rows[f"tool {name}"] = {
                "new_ms": 1e3 * new, "cached_ms": 1e3 * cached,
                "wait_new_ms": 1e3 * wait_new, "wait_cached_ms": 1e3 * wait_cached,
            }  # fmt: skip
            print(
                f"{'tool ' + name:20} new {1e3 * new:7.1f} ms  cached {1e3 * cached:7.1f} ms; "
                f"waited for the constraint {1e3 * wait_new:6.1f} / {1e3 * wait_cached:6.1f} ms"
            )
    extra = statistics.median(
        r["new_ms"] - r["cached_ms"] for n, r in rows.items() if not n.startswith("tool ")
    )
    tool_rows = [r for n, r in rows.items() if n.startswith("tool ")]
    tools = statistics.median(r["new_ms"] - r["cached_ms"] for r in tool_rows)
    tool_wait = statistics.median(r["wait_new_ms"] - r["wait_cached_ms"] for r in tool_rows)
    print(f"a new constraint's first token: p50 {extra:.1f} ms more than a cached one's")
    print(
        f"a new custom tool's first call piece: p50 {tools:.1f} ms more than a cached one's "
        f"(its prompt, which holds the grammar, is new too); its wait for the constraint: "
        f"p50 {tool_wait:.1f} ms more"
    )
    if out:
        summary = {
            "rows": rows, "extra_ms_p50": extra, "tool_extra_ms_p50": tools,
            "tool_wait_extra_ms_p50": tool_wait,
        }  # fmt: skip
        out.write_text(json.dumps(summary, indent=1) + "\n")


def _warm(vocab: Any, lltok: Any) -> None:
    """Load both sides' compiled code before anything is timed."""
    import llguidance

    from gclm.compiler.front.grammar.frames import grammar_frames
    from gclm.compiler.grown.pushdown import PushdownTable

    grammar = 'start: t\nt: "(" t ")" | "x"'
    frames = grammar_frames(grammar)
    assert frames is not None
    table = PushdownTable.of_frames(frames, vocab)
    table.row(table.initial, 10)
    llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)


def _fresh(grammar: Any, r: int) -> Any:
    """The same language, spelled so that neither side has it cached."""
    if isinstance(grammar, dict):
        return {**grammar, "title": f"fresh {r}"}
    return grammar + "\n" * r


def _frames(grammar: Any) -> Any:
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.front.grammar.frames import grammar_frames
    from gclm.compiler.front.json_schema.frames import schema_frames

    if isinstance(grammar, dict):
        return schema_frames(Constraint.json_schema(grammar))
    return grammar_frames(grammar)


def _llg_grammar(grammar: Any) -> Any:
    import llguidance

    if isinstance(grammar, dict):
        return llguidance.LLMatcher.grammar_from_json_schema(grammar)
    return llguidance.LLMatcher.grammar_from_lark(grammar)


def _one(
    name: str, grammar: Any, opener: str, vocab: Any, lltok: Any, steps: int, repeats: int
) -> dict[str, Any]:
    import llguidance
    import llguidance.torch as llt

    from gclm.compiler.grown.pushdown import PushdownTable

    budget = steps + 16
    new_g, cached_g, new_l, cached_l = [], [], [], []
    for r in range(repeats):
        text = _fresh(grammar, r + 10)  # a grammar neither side has seen
        t0 = time.perf_counter()
        frames = _frames(text)
        assert frames is not None
        table = PushdownTable.of_frames(frames, vocab)
        table.row(table.initial, budget)
        new_g.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        table.row(table.initial, budget)
        cached_g.append(time.perf_counter() - t0)
        bitmask = llt.allocate_token_bitmask(1, lltok.vocab_size)
        t0 = time.perf_counter()
        compiled = _llg_grammar(text)
        matcher = llguidance.LLMatcher(lltok, compiled, log_level=0)
        llt.fill_next_token_bitmask(matcher, bitmask, 0)
        new_l.append(time.perf_counter() - t0)
        assert not matcher.is_error(), matcher.get_error()
        t0 = time.perf_counter()
        matcher = llguidance.LLMatcher(lltok, compiled, log_level=0)
        llt.fill_next_token_bitmask(matcher, bitmask, 0)
        cached_l.append(time.perf_counter() - t0)

    opening = np.array(
        [bool(b) and set(b) <= set(opener.encode()) for b in vocab.token_bytes], dtype=bool
    )
    step_g: dict[int, float] = {}
    step_l: dict[int, float] = {}
    step_r: dict[int, float] = {}
    deepest = rejected = 0
    for batch in (8, 64):
        times_g: list[float] = []
        times_l: list[float] = []
        for r in range(repeats):
            frames = _frames(_fresh(grammar, r + 1))  # a fresh table each repeat
            assert frames is not None
            table = PushdownTable.of_frames(frames, vocab)
            times, chosen, deep = _generate(table, batch, steps, vocab, opening, r)
            times_g += times
            deepest = max(deepest, deep)
            # llguidance: the same tokens, a matcher per row.
            lark = _llg_grammar(grammar)
            matchers = [llguidance.LLMatcher(lltok, lark, log_level=0) for _ in range(batch)]
            llmask = llt.allocate_token_bitmask(batch, lltok.vocab_size)
            for step in range(steps):
                live = [i for i in range(batch) if step < len(chosen[i])]
                if not live:
                    break
                t0 = time.perf_counter()
                for i in live:
                    llt.fill_next_token_bitmask(matchers[i], llmask, i)
                times_l.append(time.perf_counter() - t0)
                for i in live:
                    if not matchers[i].consume_token(chosen[i][step]):
                        rejected += 1
                        chosen[i] = chosen[i][:step]
        step_g[batch] = 1e3 * statistics.median(times_g)
        step_l[batch] = 1e3 * statistics.median(times_l)
        step_r[batch] = 1e3 * statistics.median(
            t
            for r in range(repeats)
            for t in _regular_steps(grammar, r, batch, steps, vocab, opening)
        )
    return {
        "gclm_first_new_ms": 1e3 * statistics.median(new_g),
        "gclm_first_cached_ms": 1e3 * statistics.median(cached_g),
        "llg_first_new_ms": 1e3 * statistics.median(new_l),
        "llg_first_cached_ms": 1e3 * statistics.median(cached_l),
        "gclm_step_ms": step_g,
        "llg_step_ms": step_l,
        "regular_step_ms": step_r,
        "deepest": deepest,
        "llg_rejected": rejected,
    }


def _regular_steps(
    grammar: Any, r: int, batch: int, steps: int, vocab: Any, opening: np.ndarray
) -> list[float]:
    """Per step, the time to fill `batch` rows of the same grammar as a regular constraint:
    its recursion unrolled into one regex (3 deep, as served before the stack), a fresh
    grown table, generated the same way (its outputs are its own: the regex stops nesting
    at 3)."""
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.front.regex import to_regex
    from gclm.compiler.grown.lazy_dfa import GrowingLazyTable

    text = _fresh(grammar, r + 1)
    c = Constraint.json_schema(text) if isinstance(text, dict) else Constraint.grammar(text)
    table = GrowingLazyTable.of_regex(to_regex(c).regex, vocab)
    return _generate(table, batch, steps, vocab, opening, r)[0]


def _generate(
    table: Any, batch: int, steps: int, vocab: Any, opening: np.ndarray, seed: int
) -> tuple[list[float], list[list[int]], int]:
    """`batch` sequences through `table`'s masks, each token random, pushed toward the
    opening tokens (7 times in 10), with a budget of steps + 16: the seconds each step's
    rows took to fill, each sequence's tokens, and the deepest stack reached (a
    PushdownTable's; 0 for another table)."""
    from gclm.masking import ConstraintState, allocate_bitmask, fill_bitmask

    budget = steps + 16
    rng = np.random.default_rng(seed)
    states = [ConstraintState(table) for _ in range(batch)]
    bitmask = allocate_bitmask(batch, vocab.size)
    chosen: list[list[int]] = [[] for _ in range(batch)]
    times: list[float] = []
    deepest = 0
    for step in range(steps):
        live = [i for i, s in enumerate(states) if not s.finished]
        if not live:
            break
        t0 = time.perf_counter()
        for i in live:
            fill_bitmask(bitmask, i, states[i], budget - step)
        times.append(time.perf_counter() - t0)
        for i in live:
            allowed = np.flatnonzero(
                np.unpackbits(bitmask[i].numpy().view(np.uint8), bitorder="little")
            )
            allowed = allowed[allowed < vocab.size]
            pushed = allowed[opening[allowed]]
            pick = pushed if pushed.size and rng.random() < 0.7 else allowed
            token = int(rng.choice(pick))
            states[i].advance(token, budget - step)
            if not states[i].finished:
                chosen[i].append(token)
                if hasattr(table, "depth"):
                    deepest = max(deepest, table.depth(states[i].state))
    return times, chosen, deepest


if __name__ == "__main__":
    main()
