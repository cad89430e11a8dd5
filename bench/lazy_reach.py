"""How much of a schema's byte DFA a request needs: the case for determinizing it lazily.

    python -m bench.lazy_reach [--schemas DIR] [--limit N] [--vocab 49k 200k]
                               [--timeout S] [--json PATH]

On the whole corpus a new schema's first mask waits mostly for outlines-core's build of the
regex's whole byte DFA (docs/first-mask.md: in process p90 0.5 s, p99 4 s; up to 240,000
states). A LazyTable reads only the states that the vocabulary's trie walk passes through
from the states generation stands in. This counts them, per schema of the MaskBench corpus
(../shared/jsonschemabench):

- `first`: the DFA states the first mask's walk passes through (every prefix of every token
  from the start state);
- `instance`: the states passed through by the walks from every state a request stands in
  while it writes the schema's first valid instance that the regex accepts (json.dumps,
  tokenized by the tokenizer, each token's bytes walked through the DFA); schemas with none
  the regex accepts have no `instance` figure;
- `states`: all the DFA's states, and `dfa_ms`: outlines-core's build of them (to_regex, the
  build and the read into a table; one run).

A DFA determinized lazily (an NFA of the regex and a subset construction run state by state
as the walks reach them) would build `first` states before the first mask and `instance` for
the whole request, instead of `states`. This is a count, not a timing of such a builder:
gclm has none yet. Each schema runs in a child process that is killed after `--timeout`
seconds (those schemas are reported as timed out).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np

from bench.jsonschemabench import DEFAULT_DIR


@nb.njit(cache=True, nogil=True)
def _touch(trans, columns, state, node_byte, node_depth, node_skip, max_depth, seen):
    """Mark in `seen` every DFA state the trie's preorder walk from `state` passes through
    (as compiler/grown/state_walk.walk_trie walks it); returns how many were new."""
    path = np.empty(max_depth + 1, dtype=np.int64)
    path[0] = state
    new = 0
    if not seen[state]:
        seen[state] = True
        new += 1
    k = 0
    while k < node_byte.size:
        nxt = trans[path[node_depth[k] - 1], columns[node_byte[k]]]
        if nxt < 0:
            k = node_skip[k]
            continue
        path[node_depth[k]] = nxt
        if not seen[nxt]:
            seen[nxt] = True
            new += 1
        k += 1
    return new


def _boundary_states(dfa: Any, token_bytes: list[bytes]) -> list[int] | None:
    """The DFA states before each token of a token path, None when the DFA refuses it."""
    columns, trans = dfa.columns, dfa.next
    state, stood = 0, []
    for data in token_bytes:
        stood.append(state)
        for byte in data:
            state = int(trans[state, columns[byte]])
            if state < 0:
                return None
    return stood if dfa.accepting[state] else None


def _measure(schema: Any, tests: list[Any], vocab: Any, trie: Any, tokenizer: Any) -> dict:
    from gclm.compiler.front.constraint import Constraint
    from gclm.compiler.front.regex import to_regex
    from gclm.compiler.whole.byte_dfa import byte_dfa

    start = time.perf_counter()
    dfa = byte_dfa(to_regex(Constraint.json_schema(schema)).regex)
    out: dict[str, Any] = {"dfa_ms": (time.perf_counter() - start) * 1e3}
    states = dfa.next.shape[0]
    out["states"] = states
    seen = np.zeros(states, dtype=np.bool_)

    def touch(state: int) -> int:
        return int(
            _touch(
                dfa.next, dfa.columns, state, trie.byte, trie.depth, trie.skip,
                trie.max_depth, seen,
            )
        )  # fmt: skip

    out["first"] = touch(0)
    for instance in tests:
        ids = tokenizer.encode(json.dumps(instance), add_special_tokens=False)
        stood = _boundary_states(dfa, [vocab.token_bytes[i] or b"" for i in ids])
        if stood is None:
            continue
        for state in stood:
            touch(state)
        out["instance"] = int(seen.sum())
        out["instance_tokens"] = len(ids)
        break
    return out


def _child(conn: Any, vocab_name: str) -> None:
    from bench.first_mask import load_tokenizer
    from gclm.compiler.vocab.trie import token_trie
    from gclm.compiler.vocab.vocabulary import TokenVocabulary

    tokenizer = load_tokenizer(vocab_name)
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    trie = token_trie(vocab)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        schema, tests = job
        try:
            conn.send(_measure(schema, tests, vocab, trie, tokenizer))
        except Exception as e:  # noqa: BLE001 - a schema gclm refuses: report it, go on
            conn.send({"error": f"{type(e).__name__}: {str(e)[:120]}"})


def run(paths: list[Path], vocab_name: str, timeout: float) -> list[dict[str, Any]]:
    """One row per schema file, each measured in a child process (restarted after a timeout)."""
    rows: list[dict[str, Any]] = []
    conn = proc = None
    for path in paths:
        if proc is None:
            conn, theirs = mp.Pipe()
            proc = mp.Process(target=_child, args=(theirs, vocab_name), daemon=True)
            proc.start()
            conn.recv()
        data = json.loads(path.read_text())
        tests = [t["data"] for t in data.get("tests", []) if t.get("valid")]
        conn.send((data["schema"], tests))
        if conn.poll(timeout):
            row = conn.recv()
        else:
            proc.kill()
            proc.join()
            conn = proc = None
            row = {"timeout": timeout}
        rows.append({"name": path.stem, **row})
        print(json.dumps(rows[-1]), flush=True)
    if proc is not None:
        conn.send(None)
        proc.join()
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles of the counts and of their share of the DFA's states."""
    done = [r for r in rows if "states" in r]
    slow = [r for r in done if r["dfa_ms"] > 50]

    def pct(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        return {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)} | {
            "max": float(max(values))
        }

    def part(group: list[dict[str, Any]]) -> dict[str, Any]:
        inst = [r for r in group if "instance" in r]
        return {
            "schemas": len(group),
            "states": pct([r["states"] for r in group]),
            "dfa_ms": pct([r["dfa_ms"] for r in group]),
            "first": pct([r["first"] for r in group]),
            "first_share": pct([r["first"] / r["states"] for r in group]),
            "with_instance": len(inst),
            "instance": pct([r["instance"] for r in inst]),
            "instance_share": pct([r["instance"] / r["states"] for r in inst]),
        }

    return {
        "all": part(done),
        "dfa_over_50ms": part(slow),
        "refused": sum(1 for r in rows if "error" in r),
        "timed_out": sum(1 for r in rows if "timeout" in r),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--vocab", choices=("49k", "200k"), default="200k")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    paths = sorted(args.schemas.glob("*.json"))[: args.limit]
    if not paths:
        raise SystemExit(f"No schemas in {args.schemas}; pass --schemas DIR.")
    rows = run(paths, args.vocab, args.timeout)
    result = {"vocab": args.vocab, "summary": summarize(rows), "schemas": rows}
    for name, part in result["summary"].items():
        print(name, json.dumps(part))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
