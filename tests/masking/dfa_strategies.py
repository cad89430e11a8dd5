"""Random small DFAs for the masking tests, and a reference decoder that uses the masks."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st

from gclm.compiler.whole.tables import CompiledTable, build_table
from gclm.masking import (
    ConstraintState,
    allocate_bitmask,
    apply_bitmask,
    check_budget,
    fill_bitmask,
)


def table_from_edges(
    vocab_size: int,
    eos: int,
    num_states: int,
    accepting: list[int],
    edges: list[tuple[int, int, int]],
    initial: int = 0,
) -> CompiledTable:
    """A table from (src, token, dst) triples; accepting is a list of state ids."""
    acc = np.zeros(num_states, dtype=bool)
    acc[accepting] = True
    arr = np.array(edges, dtype=np.int64).reshape(-1, 3)  # [E, 3]
    src, tok, dst = arr[:, 0], arr[:, 1], arr[:, 2]
    return build_table(
        vocab_size=vocab_size,
        eos_token_id=eos,
        initial=initial,
        num_states=num_states,
        accepting=acc,
        src=src,
        tokens=tok,
        dst=dst,
    )


@st.composite
def random_tables(draw: st.DrawFn, max_states: int = 8, max_vocab: int = 70) -> CompiledTable:
    """A random DFA over up to `max_vocab` tokens (crossing word boundaries), pruned by
    build_table; rejected when the initial state cannot reach acceptance."""
    vocab_size = draw(st.integers(2, max_vocab))
    eos = draw(st.integers(0, vocab_size - 1))
    num_states = draw(st.integers(1, max_states))
    # Accepting states are few and rarely the initial one, so that outputs need tokens.
    first = 1 if num_states > 1 and draw(st.integers(0, 4)) else 0
    accepting = draw(st.lists(st.integers(first, num_states - 1), min_size=1, max_size=2))
    tokens = [t for t in range(vocab_size) if t != eos]
    # A chain (each state steps forward once, other edges go back) makes long distances.
    chain = draw(st.booleans())
    if chain:
        accepting = [num_states - 1]
    edges = []
    for s in range(num_states):
        row = draw(st.lists(st.sampled_from(tokens), unique=True, max_size=min(4, len(tokens))))
        top = s if chain else num_states - 1
        edges += [(s, t, draw(st.integers(0, top))) for t in row[1:]]
        if row:
            nxt = min(s + 1, num_states - 1) if chain else draw(st.integers(0, top))
            edges.append((s, row[0], nxt))
    # Occasionally a dense row, like a state inside a JSON string.
    if draw(st.booleans()):
        s = draw(st.integers(0, num_states - 1))
        taken = {t for src, t, _ in edges if src == s}
        edges += [(s, t, s) for t in tokens if t not in taken]
    try:
        return table_from_edges(vocab_size, eos, num_states, accepting, edges)
    except ValueError:
        assume(False)
        raise


def reference_allowed(table: CompiledTable, state: int, tokens_left: int | None) -> set[int]:
    """Allowed tokens by the budget semantics, by a plain loop (slow, obviously right)."""
    toks, nxt = table.transitions(state)
    allowed = {
        int(t)
        for t, n in zip(toks, nxt, strict=True)
        if tokens_left is None or table.dist[n] <= tokens_left - 1
    }
    if table.accepting[state]:
        allowed.add(table.eos_token_id)
    return allowed


def bits_of(row: np.ndarray | torch.Tensor) -> set[int]:
    """Token ids whose bit is set in one packed int32 row."""
    arr = row.numpy() if isinstance(row, torch.Tensor) else row
    bits = np.unpackbits(np.ascontiguousarray(arr).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def decode(
    table: CompiledTable,
    budget: int,
    *,
    seed: int,
    greedy: bool,
    logits_pad: int = 0,
) -> tuple[list[int], ConstraintState]:
    """Generate with the masks from random logits; returns the non-EOS tokens and the state."""
    check_budget(table, budget)
    gen = torch.Generator().manual_seed(seed)
    seq = ConstraintState(table)
    bitmask = allocate_bitmask(1, table.vocab_size)
    out: list[int] = []
    left = budget
    while not seq.must_stop(left):
        fill_bitmask(bitmask, 0, seq, left)
        logits = torch.randn(1, table.vocab_size + logits_pad, generator=gen) * 3  # [1, V]
        apply_bitmask(logits, bitmask)
        assert torch.isfinite(logits).any()
        if greedy:
            tok = int(logits.argmax())
        else:
            tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        assert tok < table.vocab_size, "a padded logit column was sampled"
        seq.advance(tok, left)
        if seq.finished:
            break
        out.append(tok)
        left -= 1
    return out, seq
