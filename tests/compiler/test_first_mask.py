"""First masks: the byte DFA a compile sends ahead of its table, made a LazyTable, and the
table cache handing out whichever comes first (compiler/first_mask.py, TableCache.fetch_first).
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from gclm.compiler.cache import TableCache
from gclm.compiler.compile import compile_constraint
from gclm.compiler.constraint import Constraint
from gclm.compiler.first_mask import FirstMasks, lazy_table
from gclm.compiler.lazy_table import LazyTable
from gclm.compiler.pool import CompilerPool
from gclm.compiler.regex import to_regex
from gclm.compiler.tables import CompiledTable
from gclm.compiler.token_walk import byte_dfa
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.compiler.worker import CompileLimits
from gclm.errors import CompileLimitError, ConstraintError
from gclm.masking import ConstraintState, mask_table

# Every byte a token by itself, two longer tokens and EOS (id 258).
BYTES = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), b'{"a": ', b"}", None), eos_token_id=258, scheme="plain"
)
NUMBER = Constraint.regex(r'\{"a": [0-9]{1,3}\}')


def dfa_of(constraint: Constraint):
    return byte_dfa(to_regex(constraint).regex)


class HeldCompile:
    """A compile function whose tables arrive when the test says so."""

    def __init__(self) -> None:
        self.futures: dict[str, Future[CompiledTable]] = {}

    def __call__(self, constraint: Constraint) -> Future[CompiledTable]:
        future: Future[CompiledTable] = Future()
        self.futures[constraint.key_material()] = future
        return future

    def land(self, constraint: Constraint) -> CompiledTable:
        table = compile_constraint(constraint, BYTES)
        self.futures[constraint.key_material()].set_result(table)
        return table


class HeldMasks:
    """A first_masks function whose LazyTables arrive when the test says so: one per
    constraint, as FirstMasks gives one per compile."""

    def __init__(self) -> None:
        self.asked: list[Constraint] = []
        self.futures: dict[str, Future[LazyTable | None]] = {}

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None]:
        self.asked.append(constraint)
        return self.futures.setdefault(constraint.key_material(), Future())

    def land(self, constraint: Constraint) -> LazyTable:
        lazy = LazyTable(dfa_of(constraint), BYTES)
        self.futures[constraint.key_material()].set_result(lazy)
        return lazy


def test_first_masks_come_before_the_table_and_the_table_is_kept() -> None:
    compiles, masks = HeldCompile(), HeldMasks()
    cache = TableCache(compiles, BYTES.fingerprint, first_masks=masks)
    first = cache.fetch_first(NUMBER)
    joined = cache.fetch_first(NUMBER)  # a second request during the same compile
    assert not first.done()
    lazy = masks.land(NUMBER)
    assert first.result(timeout=5) is lazy and joined.result(timeout=5) is lazy
    assert len(masks.asked) == 2  # asked for each request while the table compiles
    # Its first mask is the whole table's.
    table = compiles.land(NUMBER)
    whole = ConstraintState(table).allowed_row(64)
    assert np.array_equal(ConstraintState(lazy).allowed_row(64), whole)
    # Once the table is compiled it answers, at once; no more first masks are made.
    assert cache.fetch_first(NUMBER).result(timeout=5) is table
    assert len(masks.asked) == 2


def test_the_table_answers_when_it_comes_first() -> None:
    compiles, masks = HeldCompile(), HeldMasks()
    cache = TableCache(compiles, BYTES.fingerprint, first_masks=masks)
    first = cache.fetch_first(NUMBER)
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table
    masks.land(NUMBER)  # too late: nothing changes
    assert first.result() is table


@pytest.mark.parametrize("masks_outcome", [None, RuntimeError("a bug")])
def test_no_first_masks_means_waiting_for_the_table(masks_outcome) -> None:
    compiles, masks = HeldCompile(), HeldMasks()
    cache = TableCache(compiles, BYTES.fingerprint, first_masks=masks)
    first = cache.fetch_first(NUMBER)
    future = masks.futures[NUMBER.key_material()]
    if masks_outcome is None:
        future.set_result(None)
    else:
        future.set_exception(masks_outcome)
    assert not first.done()
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table


def test_a_failed_compile_before_its_first_masks_is_the_answer() -> None:
    compiles, masks = HeldCompile(), HeldMasks()
    cache = TableCache(compiles, BYTES.fingerprint, first_masks=masks)
    first = cache.fetch_first(NUMBER)
    compiles.futures[NUMBER.key_material()].set_exception(ConstraintError("no output"))
    with pytest.raises(ConstraintError, match="no output"):
        first.result(timeout=5)
    # Remembered: the next request is refused at once, without first masks.
    with pytest.raises(ConstraintError):
        cache.fetch_first(NUMBER).result(timeout=0)
    assert len(masks.asked) == 1


def test_without_first_masks_fetch_first_is_fetch() -> None:
    compiles = HeldCompile()
    cache = TableCache(compiles, BYTES.fingerprint)
    first = cache.fetch_first(NUMBER)
    assert not first.done()
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table


def test_lazy_table_refuses_what_it_cannot_serve() -> None:
    assert lazy_table(dfa_of(NUMBER), BYTES) is not None
    # A byte that is no token by itself: the DFA gives no proof of a token path.
    letters = TokenVocabulary((b"ab", b"a", None), eos_token_id=2, scheme="plain")
    assert lazy_table(dfa_of(Constraint.regex("ab")), letters) is None


def test_the_pool_sends_the_byte_dfa_ahead_of_the_table(embedded_vocab) -> None:
    """A real compile worker: the DFA it sends is the constraint's byte DFA, and its
    LazyTable's first mask is the compiled table's."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    constraint = Constraint.json_schema(schema)
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=120), workers=1, early_dfa=True)
    try:
        first = FirstMasks(pool.early_dfa, embedded_vocab)
        table_future = pool.submit(constraint)
        lazy_future = first(constraint)
        assert lazy_future is not None
        lazy = lazy_future.result(timeout=120)
        assert lazy is not None
        expected = dfa_of(constraint)
        assert np.array_equal(lazy._trans, expected.next)
        table = table_future.result(timeout=120)
        row = mask_table(table).row(table.initial, 64)
        assert np.array_equal(lazy.row(lazy.initial, 64), row)
        assert pool.early_dfa(constraint) is None  # the compile is over
        first.close()
    finally:
        pool.close()


def test_a_dfa_over_the_state_limit_is_not_sent(embedded_vocab) -> None:
    """The whole compile refuses it; so no request may start on it."""
    constraint = Constraint.json_schema({"type": "string", "maxLength": 50})
    pool = CompilerPool(
        embedded_vocab, CompileLimits(timeout_s=120, max_states=20), workers=1, early_dfa=True
    )
    try:
        table_future = pool.submit(constraint)
        dfa = pool.early_dfa(constraint)
        assert dfa is not None
        assert dfa.result(timeout=120) is None
        with pytest.raises(CompileLimitError):
            table_future.result(timeout=120)
    finally:
        pool.close()


def test_a_pool_without_early_dfas_sends_none(embedded_vocab) -> None:
    """`--first-mask whole` and vLLM's frontend: no DFA crosses the pipe."""
    constraint = Constraint.json_schema({"type": "string", "maxLength": 5})
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=120), workers=1)
    try:
        table_future = pool.submit(constraint)
        dfa = pool.early_dfa(constraint)
        assert dfa is not None
        table_future.result(timeout=120)
        assert dfa.result(timeout=5) is None
    finally:
        pool.close()


def test_one_lazy_table_per_compile_however_many_ask() -> None:
    """FirstMasks builds one LazyTable per compile's DFA, also for requests that join the
    compile after the first one's wait ended (a 429 at its timeout, say)."""
    dfa: Future = Future()
    first = FirstMasks(lambda constraint: dfa, BYTES)
    try:
        a, b = first(NUMBER), first(NUMBER)
        assert a is b
        expected = dfa_of(NUMBER)
        dfa.set_result((expected.next, expected.accepting))
        lazy = a.result(timeout=30)
        assert isinstance(lazy, LazyTable) and first(NUMBER).result(timeout=5) is lazy
    finally:
        first.close()
