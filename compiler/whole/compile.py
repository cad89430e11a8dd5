"""Constraint -> regex -> byte DFA -> token walk -> CompiledTable, in this process.

outlines-core builds the regex's DFA, compiler/whole/minimize.py makes it minimal (every later
stage costs per state), compiler/whole/token_walk.py walks the vocabulary through it
(what outlines-core's token Index does, about 30x faster on string-heavy schemas), and
compiler/whole/tables.py computes distances and prunes. `table_from_index`
(bench/outlines_index.py) reads an outlines-core token Index, for tests and benchmarks that
compare the two.

The server does not call this on its own threads: compiler/service/worker.py runs it in a worker
process with a timeout and a memory limit, and compiler/service/cache.py keeps the results.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.service.progress import Reporter
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa, byte_dfa
from gclm.compiler.whole.minimize import minimized
from gclm.compiler.whole.tables import CompiledTable, finish_table, with_shortest_output
from gclm.compiler.whole.token_walk import GroupedIndex, walk_tokens
from gclm.errors import CompileLimitError, ConstraintError

log = logging.getLogger("gclm.compiler")


def compile_constraint(
    constraint: Constraint,
    vocab: TokenVocabulary,
    *,
    max_states: int | None = None,
    progress: np.ndarray | None = None,
    on_dfa: Callable[[ByteDfa], None] | None = None,
) -> CompiledTable:
    """Compile `constraint` for `vocab`, reporting how far it got in `progress` (the
    slots of compiler/service/progress.py, read by the pool for a Retry-After). `on_dfa` is given
    the byte DFA as soon as it is built, before the token walk (the pool's workers send it
    on, for the first masks: compiler/grown/lazy_table.py).

    Raises ConstraintError when the constraint is invalid, unsupported, or has no output
    that the vocabulary can spell; CompileLimitError past `max_states` DFA states.
    """
    started = time.perf_counter()
    report = Reporter(progress)
    built = build_dfa(constraint)
    if on_dfa is not None:
        on_dfa(built.dfa)
    return table_from_dfa(built, vocab, started, report, max_states=max_states)


@dataclass(frozen=True)
class BuiltDfa:
    """A constraint's byte DFA, and what its regex's normalisation rewrote."""

    dfa: ByteDfa
    rewrites: tuple[str, ...]
    regex_chars: int


def build_dfa(constraint: Constraint) -> BuiltDfa:
    """The constraint's byte DFA as outlines-core builds it: the first half of
    `compile_constraint`, all a LazyTable needs (which walks only the states generation
    reaches, so it is not made minimal first: that would delay the first mask). Raises
    what `compile_constraint` raises for the regex."""
    regex = to_regex(constraint)
    try:
        dfa = byte_dfa(regex.regex)
    except (ValueError, RuntimeError, OverflowError) as e:
        raise index_error(e, len(regex.regex)) from e
    return BuiltDfa(dfa, tuple(regex.rewrites), len(regex.regex))


def table_from_dfa(
    built: BuiltDfa,
    vocab: TokenVocabulary,
    started: float,
    report: Reporter,
    *,
    max_states: int | None = None,
    minimal: bool = True,
) -> CompiledTable:
    """The second half of `compile_constraint`: the DFA made minimal (unless not
    `minimal`), the token walk from every state, distances and pruning. `started`
    (perf_counter) and `report` were made when the compile began."""
    dfa = minimized(built.dfa) if minimal else built.dfa
    # The token walk stops as soon as the limit is passed: a refusal costs what it walked.
    # Every state of a minimal DFA may be reached (of one as built, all but the one before
    # the sentinel): the walk's progress is counted against them (or the limit).
    reachable = dfa.next.shape[0] - (0 if minimal else 1)
    report.walking(reachable if max_states is None else min(reachable, max_states))
    grouped = walk_tokens(dfa, vocab, max_states=max_states, progress=report.slots)
    if grouped is None:
        raise too_many_states(f"more than {max_states}", max_states)
    report.finishing()
    if not grouped.accepting.any():
        # What outlines-core's token Index refuses as an incompatible vocabulary.
        raise index_error(ValueError("vocabulary provided is incompatible"), built.regex_chars)
    table = table_from_grouped(grouped, vocab, max_states=max_states)
    table = with_shortest_output(table, vocab.token_bytes)
    return table.with_info(rewrites=built.rewrites, compile_seconds=time.perf_counter() - started)


def too_many_states(states: object, max_states: int | None) -> CompileLimitError:
    """The refusal of a constraint whose DFA has more than `max_states` states."""
    return CompileLimitError(
        f"The constraint compiles to {states} DFA states, over the limit of {max_states}. "
        "Simplify the schema (fewer optional properties, smaller maxLength or maxItems)."
    )


def index_error(e: Exception, regex_chars: int) -> ConstraintError:
    """gclm's own error for outlines-core refusing a regex (its text never reaches a client:
    it is logged)."""
    log.info("outlines-core refused a %d-character regex: %r", regex_chars, e)
    if "Failed to build DFA" in str(e):
        # regex-automata's NFA size limit: the regex is valid but too large to build.
        return CompileLimitError(
            f"The constraint's regex ({regex_chars:,} characters) is over the size limit of "
            "outlines-core's automaton builder. Use smaller bounds (numbers, maxLength, "
            "maxItems, repetition counts) or a simpler pattern."
        )
    if "vocabulary provided is incompatible" in str(e):
        return ConstraintError(
            "The constraint could not be compiled: its outputs need a character that no token "
            "of this model spells. Check the constraint's characters (and the model's "
            "vocabulary)."
        )
    return ConstraintError(
        "outlines-core could not compile the constraint's regex. Simplify the constraint."
    )


def table_from_grouped(
    grouped: GroupedIndex,
    vocab: TokenVocabulary,
    *,
    max_states: int | None = None,
) -> CompiledTable:
    """Distances and pruning; the shortest output is left unspelled."""
    states = grouped.accepting.shape[0]
    if max_states is not None and states > max_states:
        raise too_many_states(states, max_states)
    try:
        return finish_table(
            vocab_size=vocab.size,
            eos_token_id=vocab.eos_token_id,
            initial=grouped.initial,
            accepting=grouped.accepting,
            group_src=grouped.group_src,
            group_next=grouped.group_next,
            group_set=grouped.group_set,
            packed_sets=grouped.packed_sets,
            state_set=grouped.state_set,
        )
    except ValueError as e:
        raise ConstraintError(
            "No output satisfies the constraint with this model's tokens: " + str(e)
        ) from e
