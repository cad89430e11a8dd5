"""A probe, not gclm's compiler: the first mask from a DFA determinized lazily, in Python.

    python -m bench.lazy_dfa [--schemas DIR] [--reach JSON] [--min-ms MS] [--limit N]
                             [--max-chars N] [--vocab 49k 200k] [--json PATH]

(--reach: bench/lazy_reach.py's results, which say how long each schema's DFA took; --limit:
the N slowest.)

bench/lazy_reach.py counts that a first mask reads 3-18 states of a byte DFA that
outlines-core builds whole (up to 240,000 states). This times the other way, on the schemas
whose byte DFA takes over `--min-ms` to build: the regex parsed (Python's own parser,
`re._parser`), a Thompson NFA over bytes built from it (Unicode classes as UTF-8 byte
ranges), each NFA state's byte distance to acceptance (one reverse 0-1 BFS: a subset's is
the least of its members', which gives a LazyTable's bounds), and the subset construction
run only for the states the first mask's trie walk reaches. Side by side with
`byte_dfa` (outlines-core) on the same regex, one run each, and the start state's token
set compared between the two.

The probe is plain Python. Beside it, bench/lazy_nfa.py builds the same NFA and bounds in
compiled code (numba) from the parsed regex, checked equal to the Python build, and alone
for regexes over `--max-chars` (too long for the Python build). Regexes with constructs
the probe does not model (classes like `\\w`, flags, look-around) are counted as skipped.
"""

from __future__ import annotations

import argparse
import json
import re._constants as sre
import re._parser as sre_parse
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from bench.jsonschemabench import DEFAULT_DIR
from gclm.compiler.grown.regex_parse import Unsupported

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
INF = 1 << 30


def _utf8(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are the UTF-8 encodings of lo..hi (no
    surrogates), as Rust's utf8-ranges splits them."""
    out: list[list[tuple[int, int]]] = []
    todo = [(lo, hi)]
    while todo:
        lo, hi = todo.pop()
        if lo > hi:
            continue
        if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
            todo += [(lo, SURROGATES[0] - 1), (SURROGATES[1] + 1, hi)]
            continue
        for edge in (0x7F, 0x7FF, 0xFFFF):
            if lo <= edge < hi:
                todo += [(lo, edge), (edge + 1, hi)]
                break
        else:
            n = len(_utf8(lo))
            for i in range(1, n):
                m = (1 << (6 * i)) - 1
                if lo & ~m != hi & ~m:
                    if lo & m:
                        todo += [(lo, lo | m), ((lo | m) + 1, hi)]
                        break
                    if hi & m != m:
                        todo += [(lo, (hi & ~m) - 1), (hi & ~m, hi)]
                        break
            else:
                out.append(list(zip(_utf8(lo), _utf8(hi), strict=True)))
    return out


def _class_ranges(items: list[tuple[Any, Any]]) -> list[tuple[int, int]]:
    """The codepoint intervals of an IN node (sorted, merged; complemented if negated)."""
    spans, negate = [], False
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            spans.append((av, av))
        elif op is sre.RANGE:
            spans.append(av)
        else:
            raise Unsupported(f"class item {op}")
    spans.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    if not negate:
        return merged
    out, at = [], 0
    for lo, hi in merged:
        if at < lo:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= MAX_CODEPOINT:
        out.append((at, MAX_CODEPOINT))
    return out


class Nfa:
    """A Thompson NFA over bytes: epsilon edges and byte-range edges per state."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []

    def new(self) -> int:
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def ranges(self, start: int, spans: list[tuple[int, int]]) -> int:
        end = self.new()
        for lo, hi in spans:
            for seq in utf8_sequences(lo, hi):
                at = start
                for i, (a, b) in enumerate(seq):
                    to = end if i == len(seq) - 1 else self.new()
                    self.edges[at].append((a, b, to))
                    at = to
        return end

    def compile(self, nodes: Any, start: int) -> int:
        """Append `nodes` (a parsed sequence) from `start`; returns its end state."""
        at = start
        for op, av in nodes:
            if op is sre.LITERAL:
                at = self.ranges(at, [(av, av)])
            elif op is sre.NOT_LITERAL:
                at = self.ranges(at, _class_ranges([(sre.NEGATE, None), (sre.LITERAL, av)]))
            elif op is sre.ANY:
                at = self.ranges(at, [(0, 9), (11, MAX_CODEPOINT)])
            elif op is sre.IN:
                at = self.ranges(at, _class_ranges(av))
            elif op is sre.SUBPATTERN:
                if av[1] or av[2]:
                    raise Unsupported("flags")
                at = self.compile(av[3], at)
            elif op is sre.BRANCH:
                end = self.new()
                for alt in av[1]:
                    s = self.new()
                    self.eps[at].append(s)
                    self.eps[self.compile(alt, s)].append(end)
                at = end
            elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
                low, high, sub = av
                for _ in range(low):
                    at = self.compile(sub, at)
                if high is sre.MAXREPEAT:
                    loop = self.new()
                    self.eps[at].append(loop)
                    self.eps[self.compile(sub, loop)].append(loop)
                    at = loop
                elif high > low:
                    end = self.new()
                    for _ in range(high - low):
                        self.eps[at].append(end)
                        at = self.compile(sub, at)
                    self.eps[at].append(end)
                    at = end
            elif op is sre.AT and av is sre.AT_END:
                continue  # only at the end: checked by the caller
            else:
                raise Unsupported(str(op))
        return at


def build_nfa(regex: str) -> tuple[Nfa, int]:
    """The NFA of `regex` (start state 0) and its accepting state."""
    parsed = sre_parse.parse(regex)
    ats = [i for i, (op, _) in enumerate(parsed) if op is sre.AT]
    if any(i != len(parsed) - 1 for i in ats):
        raise Unsupported("an anchor inside the regex")
    nfa = Nfa()
    start = nfa.new()
    return nfa, nfa.compile(parsed, start)


def distances(nfa: Nfa, accept: int) -> np.ndarray:
    """Each NFA state's fewest bytes to `accept` (a reverse 0-1 BFS); INF where none."""
    n = len(nfa.eps)
    back_eps: list[list[int]] = [[] for _ in range(n)]
    back_byte: list[list[int]] = [[] for _ in range(n)]
    for q in range(n):
        for t in nfa.eps[q]:
            back_eps[t].append(q)
        for _, _, t in nfa.edges[q]:
            back_byte[t].append(q)
    dist = [INF] * n
    dist[accept] = 0
    queue = deque([accept])
    while queue:
        t = queue.popleft()
        d = dist[t]
        for q in back_eps[t]:
            if dist[q] > d:
                dist[q] = d
                queue.appendleft(q)
        for q in back_byte[t]:
            if dist[q] > d + 1:
                dist[q] = d + 1
                queue.append(q)
    return np.array(dist, dtype=np.int64)


class LazyDfa:
    """The NFA's subset construction, a state's row computed the first time it is asked."""

    def __init__(self, nfa: Nfa, accept: int) -> None:
        self.nfa, self.accept = nfa, accept
        self.dist = distances(nfa, accept)
        self.sets: list[frozenset[int]] = []
        self.ids: dict[frozenset[int], int] = {}
        self.rows: dict[int, list[int]] = {}
        self.initial = self._id(self._closure({0}))

    def _closure(self, states: set[int]) -> frozenset[int]:
        todo, seen = list(states), set(states)
        while todo:
            for t in self.nfa.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        # States that cannot reach acceptance are left out: a set of none is the dead state.
        return frozenset(q for q in seen if self.dist[q] < INF)

    def _id(self, states: frozenset[int]) -> int:
        if not states:
            return -1
        found = self.ids.get(states)
        if found is None:
            found = self.ids[states] = len(self.sets)
            self.sets.append(states)
        return found

    def row(self, state: int) -> list[int]:
        """The state's successor per byte (-1: dead)."""
        found = self.rows.get(state)
        if found is None:
            targets: list[set[int]] = [set() for _ in range(256)]
            for q in self.sets[state]:
                for lo, hi, t in self.nfa.edges[q]:
                    for b in range(lo, hi + 1):
                        targets[b].add(t)
            by_set: dict[frozenset[int], int] = {}
            found = []
            for b in range(256):
                key = frozenset(targets[b])
                if key not in by_set:
                    by_set[key] = self._id(self._closure(targets[b])) if key else -1
                found.append(by_set[key])
            self.rows[state] = found
        return found

    def accepting(self, state: int) -> bool:
        return self.accept in self.sets[state]

    def bytes_to_accept(self, state: int) -> int:
        """The fewest bytes from `state` to acceptance (the LazyTable's bounds come from it)."""
        return int(min(self.dist[q] for q in self.sets[state]))


def trie_lists(trie: Any) -> tuple[list[int], ...]:
    """The trie's arrays as lists, made once per vocabulary (as a server holds its trie)."""
    return (
        trie.byte.tolist(), trie.depth.tolist(), trie.skip.tolist(),
        trie.token_lo.tolist(), trie.token_ids.tolist(), [trie.max_depth],
    )  # fmt: skip


def first_tokens(dfa: LazyDfa, trie: tuple[list[int], ...]) -> set[int]:
    """Token ids allowed at the start state (the successor live: every state of a LazyDfa
    is), walking the trie (`trie_lists`) in preorder as compiler/grown/state_walk.walk_trie
    does."""
    byte, depth, skip, lo, ids, (max_depth,) = trie
    allowed: set[int] = set()
    path = [dfa.initial] + [0] * max_depth
    k = 0
    while k < len(byte):
        nxt = dfa.row(path[depth[k] - 1])[byte[k]]
        if nxt < 0:
            k = skip[k]
            continue
        path[depth[k]] = nxt
        allowed.update(ids[lo[k] : lo[k + 1]])
        k += 1
    return allowed


def _measure(regex: str, vocab: Any, trie: tuple[list[int], ...], max_chars: int) -> dict[str, Any]:
    from gclm.compiler.grown.lazy_table import LazyTable
    from gclm.compiler.whole.byte_dfa import byte_dfa

    out: dict[str, Any] = {"chars": len(regex)}
    if len(regex) > max_chars:  # too long for the Python build: the compiled one alone
        out["skipped"] = f"over {max_chars} characters"
        try:
            out |= _compiled(regex, None, None)
        except (Unsupported, OverflowError, RecursionError) as e:
            return out | {"compiled_skipped": str(e)[:80]}
        parsed, program = _parsed_compiled(regex)
        t4 = time.perf_counter()
        table = LazyTable(byte_dfa(regex), vocab)
        table.walked(table.initial)
        out["outlines_ms"] = (time.perf_counter() - t4) * 1e3
        if program is not None:
            parsed["parsed_same_bound"] = parsed.pop("start_bytes") == int(table.upper[0])
        return out | parsed
    t0 = time.perf_counter()
    try:
        nfa, accept = build_nfa(regex)
    except (Unsupported, OverflowError, RecursionError) as e:
        return out | {"skipped": str(e)[:80]}
    t1 = time.perf_counter()
    lazy = LazyDfa(nfa, accept)
    t2 = time.perf_counter()
    ours = first_tokens(lazy, trie)
    t3 = time.perf_counter()
    out |= {
        "nfa_states": len(nfa.eps),
        "parse_nfa_ms": (t1 - t0) * 1e3,
        "bounds_ms": (t2 - t1) * 1e3,
        "walk_ms": (t3 - t2) * 1e3,
        "lazy_ms": (t3 - t0) * 1e3,
        "lazy_states": len(lazy.sets),
    }
    out |= _compiled(regex, len(nfa.eps), lazy.dist)
    t4 = time.perf_counter()
    table = LazyTable(byte_dfa(regex), vocab)
    walked = table.walked(table.initial)
    out["outlines_ms"] = (time.perf_counter() - t4) * 1e3
    theirs = {int(i) for g in walked.groups for i in _ids(g)}
    out["same_first_tokens"] = ours == theirs
    out["same_bound"] = lazy.bytes_to_accept(lazy.initial) == int(table.upper[table.initial])
    parsed, program = _parsed_compiled(regex)
    if program is not None:
        from bench.lazy_nfa import as_python_nfa

        parsed_lazy = LazyDfa(*as_python_nfa(program, program.root))
        parsed["parsed_same_first_tokens"] = first_tokens(parsed_lazy, trie) == theirs
        parsed["parsed_same_bound"] = parsed.pop("start_bytes") == int(table.upper[0])
    return out | parsed


def _parsed_compiled(regex: str) -> tuple[dict[str, Any], Any]:
    """The whole build in compiled code, from compiler/grown/regex_parse.py's parser: its times, the
    start state's bytes to acceptance, and the program (None when the parser refuses)."""
    from bench.lazy_nfa import compiled_nfa
    from gclm.compiler.grown.regex_parse import ParsedRegex as CompiledProgram

    t0 = time.perf_counter()
    try:
        program = CompiledProgram(regex)
    except Unsupported as e:
        return {"parsed_skipped": str(e)}, None
    t1 = time.perf_counter()
    n, _, dist = compiled_nfa(program, program.root)
    t2 = time.perf_counter()
    return {
        "compiled_parse_ms": (t1 - t0) * 1e3,
        "parsed_nfa_bounds_ms": (t2 - t1) * 1e3,
        "parsed_total_ms": (t2 - t0) * 1e3,
        "parsed_nfa_states": n,
        "start_bytes": int(dist[0]),
    }, program


def _compiled(regex: str, states: int | None, dist: np.ndarray | None) -> dict[str, Any]:
    """The same NFA and distances by bench/lazy_nfa.py's compiled code: times, its states,
    and whether they equal the Python build's (`states`, `dist`; None: not built)."""
    from bench.lazy_nfa import Program, compiled_nfa

    t0 = time.perf_counter()
    parsed = sre_parse.parse(regex)
    t1 = time.perf_counter()
    program = Program()
    root = program.seq(parsed)
    t2 = time.perf_counter()
    n, _, compiled_dist = compiled_nfa(program, root)
    t3 = time.perf_counter()
    return {
        "sre_parse_ms": (t1 - t0) * 1e3,
        "program_ms": (t2 - t1) * 1e3,
        "compiled_nfa_bounds_ms": (t3 - t2) * 1e3,
        "compiled_nfa_states": n,
        "compiled_same": None
        if dist is None
        else n == states and bool(np.array_equal(compiled_dist, dist)),
    }


def _ids(group: np.ndarray) -> np.ndarray:
    if group.dtype == np.int32:
        return group
    bits = np.unpackbits(group.view(np.uint8), bitorder="little")
    return np.flatnonzero(bits)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--reach", type=Path, default=Path("bench/results/lazy_reach_200k.json"))
    parser.add_argument("--min-ms", type=float, default=50.0)
    parser.add_argument("--limit", type=int, help="the N slowest to build")
    parser.add_argument("--max-chars", type=int, default=200_000)
    parser.add_argument("--vocab", choices=("49k", "200k"), default="200k")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from bench.first_mask import load_tokenizer
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.front.regex import to_regex
    from gclm.compiler.vocab.trie import token_trie
    from gclm.compiler.vocab.vocabulary import TokenVocabulary

    reach = json.loads(args.reach.read_text())["schemas"]
    slow = sorted(
        (r for r in reach if r.get("dfa_ms", 0) > args.min_ms), key=lambda r: -r["dfa_ms"]
    )
    names = [r["name"] for r in slow][: args.limit]
    vocab = TokenVocabulary.from_tokenizer(load_tokenizer(args.vocab))
    trie = trie_lists(token_trie(vocab))
    _compiled("(?:a|b[0-9]{1,2})*$", None, None)  # numba compiles its functions here, untimed
    _parsed_compiled("(?:a|b[0-9]{1,2})*$")
    rows = []
    for name in names:
        schema = json.loads((args.schemas / f"{name}.json").read_text())["schema"]
        regex = to_regex(Constraint.json_schema(schema)).regex
        rows.append({"name": name, **_measure(regex, vocab, trie, args.max_chars)})
        print(json.dumps(rows[-1]), flush=True)
    done = [r for r in rows if "lazy_ms" in r]
    summary = {
        "schemas": len(rows),
        "skipped": len(rows) - len(done),
        "same_first_tokens": sum(r["same_first_tokens"] for r in done),
        "same_bound": sum(r["same_bound"] for r in done),
    }
    summary["compiled_same"] = sum(bool(r["compiled_same"]) for r in done)
    parsed = [r for r in rows if "parsed_total_ms" in r]
    summary["parsed"] = {
        key: {f"p{q}": float(np.percentile([r[key] for r in parsed], q)) for q in (50, 90, 99)}
        for key in ("compiled_parse_ms", "parsed_nfa_bounds_ms", "parsed_total_ms", "outlines_ms")
    } | {
        "schemas": len(parsed),
        "refused": sum(1 for r in rows if "parsed_skipped" in r),
        "same_first_tokens": sum(bool(r.get("parsed_same_first_tokens")) for r in parsed),
        "with_first_tokens": sum("parsed_same_first_tokens" in r for r in parsed),
        "same_bound": sum(bool(r.get("parsed_same_bound")) for r in parsed),
        "faster": sum(r["parsed_total_ms"] < r["outlines_ms"] for r in parsed),
    }
    compiled = [r for r in rows if "compiled_nfa_bounds_ms" in r]
    summary["compiled_all"] = {
        key: {f"p{q}": float(np.percentile([r[key] for r in compiled], q)) for q in (50, 90, 99)}
        for key in ("sre_parse_ms", "program_ms", "compiled_nfa_bounds_ms", "outlines_ms")
    } | {"schemas": len(compiled)}
    for key in (
        "lazy_ms", "parse_nfa_ms", "bounds_ms", "walk_ms", "outlines_ms", "lazy_states",
        "sre_parse_ms", "program_ms", "compiled_nfa_bounds_ms",
    ):  # fmt: skip
        values = [r[key] for r in done]
        if values:
            summary[key] = {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)}
    print(json.dumps(summary))
    result = {"vocab": args.vocab, "min_ms": args.min_ms, "summary": summary, "schemas": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
