"""Compact per-constraint tables: successor groups, packed token masks, and distances.

The GCLM paper keeps a `(T_max+1) x S` reachability table built from a dense `S x V` tensor.
Here `R[t, s] = 1` exactly when `dist[s] <= t`, so one int32 vector from a reverse BFS serves
every budget.

Transitions are stored by successor: the tokens of state `s` that lead to the same state `n`
form a group, whose token set is one row of a TokenSets (compiler/whole/token_sets.py: a token list,
a list of the tokens it lacks, or a packed bitmask, whichever is smallest). Sets are
deduplicated across the whole table: inside a JSON string every position has the same
"k characters long" token sets, so a table of thousands of states has few distinct sets.
Each state also has its forward set (the union of its groups), the one used whenever the
budget does not bite. EOS is not stored as an edge: it is allowed exactly in accepting
states and does not spend budget (README, "Budget semantics").
"""

from __future__ import annotations

import array
import io
import json
from dataclasses import dataclass, field, replace

import numpy as np

from gclm.compiler.whole.token_sets import TokenSets, spans, words_for

UNREACHABLE = np.iinfo(np.int32).max


def scalars(values: np.ndarray) -> array.array[int]:
    """A 1-D array of ints or bools for reading one entry at a time from Python: 1-8 bytes an
    entry where a list holds a pointer and, above 256, an int object (a 100 k-state list:
    3.6 MB against 0.4 MB), and nothing for the garbage collector to walk. A read costs some
    tens of ns more than a list's."""
    code = "b" if values.dtype == np.bool_ else "q" if values.dtype.itemsize > 4 else "i"
    return array.array(
        code, values.astype({"b": np.int8, "i": np.int32, "q": np.int64}[code]).tobytes()
    )


_ARRAY_FIELDS = (
    "accepting",
    "dist",
    "group_offsets",
    "group_next",
    "group_set",
    "state_set",
)
# Bumped when the stored arrays change; a cache file of another format is compiled again.
TABLE_FORMAT = 3  # 3: group_set, state_set and set_* arrays (were *_mask, mask_*)


@dataclass(frozen=True, eq=False)
class CompiledTable:
    """A constraint compiled against one vocabulary.

    States are dense ids `0..S-1`, and every state can reach acceptance (others are pruned).
    Groups of state `s` are `group_offsets[s]:group_offsets[s+1]`; group `g` leads to
    `group_next[g]` on the tokens of set `group_set[g]` of `token_sets`.
    """

    vocab_size: int  # token ids are < vocab_size; logit columns past it are never allowed
    eos_token_id: int
    initial: int
    accepting: np.ndarray  # bool [S]
    dist: np.ndarray  # int32 [S], fewest tokens from s to an accepting state
    group_offsets: np.ndarray  # int64 [S+1]
    group_next: np.ndarray  # int32 [G]
    group_set: np.ndarray  # int32 [G], index into `token_sets`
    state_set: np.ndarray  # int32 [S], index into `token_sets`: the forward set, EOS excluded
    token_sets: TokenSets  # [M] distinct token sets
    shortest_output: str = ""
    rewrites: tuple[str, ...] = ()  # what schema normalisation changed, for the user
    compile_seconds: float = 0.0
    _max_next_dist: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def num_states(self) -> int:
        return int(self.accepting.shape[0])

    @property
    def num_groups(self) -> int:
        return int(self.group_next.shape[0])

    @property
    def min_tokens(self) -> int:
        """Fewest tokens of any output in the constraint's language."""
        return int(self.dist[self.initial])

    @property
    def nbytes(self) -> int:
        arrays = sum(getattr(self, name).nbytes for name in _ARRAY_FIELDS)
        return arrays + self.token_sets.nbytes + len(self.shortest_output.encode())

    @property
    def num_transitions(self) -> int:
        """Number of (state, token) edges, EOS excluded."""
        return int(self.token_sets.counts()[self.group_set].sum())

    @property
    def max_next_dist(self) -> np.ndarray:
        """int32 [S]: the largest distance among each state's successors (-1 if none).
        While `tokens_left - 1` is at least this, the forward mask is budget-exact."""
        if not self._max_next_dist:
            out = np.full(self.num_states, -1, dtype=np.int32)
            counts = np.diff(self.group_offsets)
            src = np.repeat(np.arange(self.num_states), counts)
            np.maximum.at(out, src, self.dist[self.group_next])
            self._max_next_dist.append(out)
        return self._max_next_dist[0]

    def groups(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(next states, mask rows) of `state`'s successor groups."""
        lo, hi = self.group_offsets[state], self.group_offsets[state + 1]
        return self.group_next[lo:hi], self.group_set[lo:hi]

    def next_state(self, state: int, token: int) -> int:
        """The state `token` leads to from `state`, or -1 if it is not allowed (EOS: -1)."""
        if not 0 <= token < self.vocab_size:
            return -1
        nexts, rows = self.groups(state)
        for nxt, row in zip(nexts.tolist(), rows.tolist(), strict=True):
            if self.token_sets.contains(row, token):
                return nxt
        return -1

    def transitions(self, state: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, next states) allowed from `state`, EOS excluded, sorted by token."""
        nexts, rows = self.groups(state)
        toks = [self.token_sets.tokens_of(r) for r in rows.tolist()]
        if not toks:
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        tokens = np.concatenate(toks)
        dest = np.repeat(nexts, [t.size for t in toks])
        order = np.argsort(tokens, kind="stable")
        return tokens[order].astype(np.int32), dest[order].astype(np.int32)

    def with_info(self, **changes: object) -> CompiledTable:
        """A copy with scalar fields (shortest_output, rewrites, compile_seconds) replaced."""
        return replace(self, _max_next_dist=[], **changes)  # type: ignore[arg-type]

    def to_bytes(self) -> bytes:
        """Serialise as an uncompressed .npz (arrays plus a JSON header; no pickle)."""
        info = {
            "format": TABLE_FORMAT,
            "vocab_size": self.vocab_size,
            "eos_token_id": self.eos_token_id,
            "initial": self.initial,
            "shortest_output": self.shortest_output,
            "rewrites": list(self.rewrites),
            "compile_seconds": self.compile_seconds,
        }
        buf = io.BytesIO()
        np.savez(
            buf,
            allow_pickle=False,
            info=np.frombuffer(json.dumps(info).encode(), dtype=np.uint8),
            **{name: getattr(self, name) for name in _ARRAY_FIELDS},
            **self.token_sets.arrays(),
        )
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> CompiledTable:
        """Load `to_bytes` output. Raises ValueError for another format or a damaged file."""
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = dict(z.items())
        info = json.loads(arrays.pop("info").tobytes())
        if info.pop("format", 1) != TABLE_FORMAT:
            raise ValueError("the table was stored by another gclm version")
        info["rewrites"] = tuple(info["rewrites"])
        token_sets = TokenSets.from_arrays(arrays, info["vocab_size"])
        return cls(**info, **{name: arrays[name] for name in _ARRAY_FIELDS}, token_sets=token_sets)


def distances(
    num_states: int, src: np.ndarray, dst: np.ndarray, accepting: np.ndarray
) -> np.ndarray:
    """Fewest edges from each state to an accepting one, by a reverse BFS over the edges.

    Vectorised by frontier: each BFS level is one pass over the edges into the current
    frontier, found through a CSR of the reversed graph. O(S + E) in total.
    Returns int32 [S]; UNREACHABLE where no accepting state can be reached.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    order = np.argsort(dst, kind="stable")
    rev_src = src[order]
    rev_offsets = np.zeros(num_states + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_states), out=rev_offsets[1:])

    dist = np.full(num_states, UNREACHABLE, dtype=np.int32)
    frontier = np.flatnonzero(accepting)
    dist[frontier] = 0
    level = 0
    while frontier.size:
        level += 1
        # All predecessors of the frontier at once.
        idx, _ = spans(rev_offsets, frontier)
        preds = np.unique(rev_src[idx])
        frontier = preds[dist[preds] == UNREACHABLE]
        dist[frontier] = level
    return dist


def finish_table(
    *,
    vocab_size: int,
    eos_token_id: int,
    initial: int,
    accepting: np.ndarray,
    group_src: np.ndarray,
    group_next: np.ndarray,
    group_set: np.ndarray,
    packed_sets: np.ndarray,
    state_set: np.ndarray | None = None,
) -> CompiledTable:
    """Compute distances, prune dead states, renumber densely and build the table.

    Input groups are sorted by `group_src` (dense ids before pruning); `packed_sets` are
    their distinct token sets as packed int32 rows [M, W]. `state_set`, the forward row of each
    state, is reused when no state is pruned. Raises ValueError if
    the initial state cannot reach acceptance.
    """
    num_states = accepting.shape[0]
    dist = distances(num_states, group_src, group_next, accepting)
    if dist[initial] == UNREACHABLE:
        raise ValueError("the constraint's language is empty for this vocabulary")
    live = dist != UNREACHABLE
    new_id = np.cumsum(live) - 1
    keep = live[group_src] & live[group_next]
    src, nxt, gmask = new_id[group_src[keep]], new_id[group_next[keep]], group_set[keep]
    n_live = int(live.sum())
    offsets = np.zeros(n_live + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n_live), out=offsets[1:])

    if state_set is not None and live.all():
        pool, group_rows, state_rows = packed_sets, gmask, state_set
    else:
        # Forward set per state: OR of its live groups' sets, deduplicated into the pool.
        forward = np.zeros((n_live, packed_sets.shape[1]), dtype=np.int32)
        np.bitwise_or.at(forward, src, packed_sets[gmask])
        pool, inverse = np.unique(
            np.concatenate([packed_sets, forward]), axis=0, return_inverse=True
        )
        inverse = inverse.reshape(-1)
        group_rows, state_rows = inverse[gmask], inverse[packed_sets.shape[0] :]
    return CompiledTable(
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        initial=int(new_id[initial]),
        accepting=np.ascontiguousarray(accepting[live]),
        dist=dist[live].astype(np.int32),
        group_offsets=offsets,
        group_next=nxt.astype(np.int32),
        group_set=np.asarray(group_rows, dtype=np.int32),
        state_set=np.asarray(state_rows, dtype=np.int32),
        token_sets=TokenSets.from_packed(pool, vocab_size),
    )


def build_table(
    *,
    vocab_size: int,
    eos_token_id: int,
    initial: int,
    num_states: int,
    accepting: np.ndarray,
    src: np.ndarray,
    tokens: np.ndarray,
    dst: np.ndarray,
    token_bytes: tuple[bytes | None, ...] | list[bytes | None] | None = None,
) -> CompiledTable:
    """Build a CompiledTable from a dense-numbered edge list (EOS edges already removed).

    The general, plain-numpy path (tests, hand-made DFAs); compiling an outlines-core Index
    goes through compiler/whole/token_walk.py and `finish_table` instead, which give the same
    table.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError("token ids must be in [0, vocab_size)")
    words = words_for(vocab_size)
    pairs, group_of_edge = np.unique(np.stack([src, dst], axis=1), axis=0, return_inverse=True)
    group_of_edge = group_of_edge.reshape(-1)
    bits = np.zeros((pairs.shape[0], words * 32), dtype=np.uint8)
    bits[group_of_edge, tokens] = 1
    group_sets = np.packbits(bits, axis=1, bitorder="little").view(np.int32)
    packed_sets, gmask = np.unique(group_sets, axis=0, return_inverse=True)
    table = finish_table(
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        initial=initial,
        accepting=np.asarray(accepting, dtype=bool),
        group_src=pairs[:, 0].reshape(-1) if pairs.size else np.zeros(0, np.int64),
        group_next=pairs[:, 1].reshape(-1) if pairs.size else np.zeros(0, np.int64),
        group_set=gmask.reshape(-1),
        packed_sets=packed_sets if packed_sets.size else np.zeros((0, words), np.int32),
    )
    return table if token_bytes is None else with_shortest_output(table, token_bytes)


def shortest_path(table: CompiledTable) -> list[int]:
    """Token ids of one shortest accepted output: at each step the lowest-id token that
    brings the distance down by one. Reads only the lowest token of each candidate group."""
    state, out = table.initial, []
    while not table.accepting[state]:
        nexts, rows = table.groups(state)
        closer = np.flatnonzero(table.dist[nexts] == table.dist[state] - 1)
        best_token, best_next = None, -1
        for g in closer.tolist():
            token = table.token_sets.first_token(int(rows[g]))
            if best_token is None or token < best_token:
                best_token, best_next = token, int(nexts[g])
        assert best_token is not None  # every state on a shortest path has a next token
        out.append(int(best_token))
        state = best_next
    return out


def with_shortest_output(
    table: CompiledTable, token_bytes: tuple[bytes | None, ...] | list[bytes | None]
) -> CompiledTable:
    """`table` with `shortest_output` spelled from `shortest_path` (shown to users)."""
    text = b"".join(token_bytes[t] or b"" for t in shortest_path(table))
    return table.with_info(shortest_output=text.decode("utf-8", "replace"))
