"""First masks: the byte DFA a compile sends ahead of its table, made a LazyTable, and the
table cache handing out whichever comes first (compiler/service/first_mask.py,
compiler/service/first_tables.py).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.service.cache import TableCache
from gclm.compiler.service.compile_job import Compiling
from gclm.compiler.service.first_mask import FirstMasks, lazy_table
from gclm.compiler.service.first_tables import FirstTables
from gclm.compiler.service.pool import CompilerPool
from gclm.compiler.service.worker import EARLY_DFA_MAX_STATES, CompileLimits
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa
from gclm.compiler.whole.compile import build_dfa, compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.compiler.whole.token_sets import unpack_row
from gclm.errors import CompileLimitError, CompilerBusyError, ConstraintError
from gclm.masking import ConstraintState, mask_table

# Every byte a token by itself, two longer tokens and EOS (id 258).
BYTES = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), b'{"a": ', b"}", None), eos_token_id=258, scheme="plain"
)
NUMBER = Constraint.regex(r'\{"a": [0-9]{1,3}\}')


def dfa_of(constraint: Constraint):
    return build_dfa(constraint).dfa


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
    """A first_masks source whose LazyTables arrive when the test says so: one per whole
    compile in flight, as FirstMasks gives one per compile, and one per FIRST compile."""

    grows = False

    def __init__(self) -> None:
        self.asked: list[Constraint] = []
        self.futures: dict[str, Future[LazyTable | None]] = {}
        self.compiled: dict[str, Compiling[CompiledTable | LazyTable | None]] = {}

    def __call__(self, constraint: Constraint) -> Future[LazyTable | None]:
        self.asked.append(constraint)
        return self.futures.setdefault(constraint.key_material(), Future())

    def compile(self, constraint: Constraint) -> Compiling[CompiledTable | LazyTable | None]:
        key = constraint.key_material()
        assert key not in self.compiled, "one FIRST compile per constraint"
        future: Compiling[CompiledTable | LazyTable | None] = Compiling()
        self.compiled[key] = future
        return future

    def from_dfa(self, data: bytes) -> Future[LazyTable | None]:
        future: Future[LazyTable | None] = Future()
        try:
            future.set_result(LazyTable(ByteDfa.from_bytes(data), BYTES))
        except (ValueError, KeyError, OSError):
            future.set_result(None)
        return future

    def gauges(self) -> dict[str, float]:
        return {}

    def land(self, constraint: Constraint) -> LazyTable:
        lazy = LazyTable(dfa_of(constraint), BYTES)
        self.futures[constraint.key_material()].set_result(lazy)
        return lazy

    def land_first(self, constraint: Constraint) -> LazyTable:
        lazy = LazyTable(dfa_of(constraint), BYTES)
        self.compiled[constraint.key_material()].set_result(lazy)
        return lazy


def fetch_first(cache: TableCache, constraint: Constraint) -> Future:
    """The first tables' answer, as the engine's FirstTables over the cache's source."""
    assert cache.first_masks is not None
    return FirstTables(cache, cache.first_masks).fetch(constraint)


def held_cache(**kwargs) -> tuple[TableCache, HeldCompile, HeldMasks]:
    compiles, masks = HeldCompile(), HeldMasks()
    return TableCache(compiles, BYTES.fingerprint, first_masks=masks, **kwargs), compiles, masks


def test_a_new_constraint_is_served_by_its_dfa_alone_and_kept() -> None:
    cache, compiles, masks = held_cache()
    first = fetch_first(cache, NUMBER)
    joined = fetch_first(cache, NUMBER)  # a second request during the same compile
    assert joined is first and not first.done()
    lazy = masks.land_first(NUMBER)
    assert first.result(timeout=5) is lazy
    assert not compiles.futures  # no whole compile: nobody needed the whole table
    # Kept by key: the next request has it at once, with what was walked for the first.
    ConstraintState(lazy).allowed_row(64)
    again = fetch_first(cache, NUMBER)
    assert again.done() and again.result() is lazy
    assert cache.gauges()["table_cache_bytes"] == lazy.nbytes > 0
    # Its first mask is the whole table's.
    table = compile_constraint(NUMBER, BYTES)
    whole = ConstraintState(table).allowed_row(64)
    assert np.array_equal(ConstraintState(lazy).allowed_row(64), whole)


def test_the_whole_table_once_compiled_answers_both_and_the_lazy_table_goes() -> None:
    cache, compiles, masks = held_cache()
    fetch_first(cache, NUMBER)
    masks.land_first(NUMBER)
    whole = cache.fetch(NUMBER)  # a request whose budget binds
    assert not whole.done()
    table = compiles.land(NUMBER)
    assert whole.result(timeout=5) is table
    assert fetch_first(cache, NUMBER).result(timeout=5) is table
    assert cache.gauges()["table_cache_entries"] == 1


def test_a_whole_compile_in_flight_answers_with_its_first_masks() -> None:
    cache, compiles, masks = held_cache()
    whole = cache.fetch(NUMBER)
    first = fetch_first(cache, NUMBER)
    assert not first.done() and not masks.compiled  # no second compile of it
    lazy = masks.land(NUMBER)
    assert first.result(timeout=5) is lazy
    table = compiles.land(NUMBER)
    assert whole.result(timeout=5) is table
    assert fetch_first(cache, NUMBER).result(timeout=5) is table


def test_a_whole_table_in_flight_answers_when_it_comes_first() -> None:
    cache, compiles, masks = held_cache()
    cache.fetch(NUMBER)
    first = fetch_first(cache, NUMBER)
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table
    masks.land(NUMBER)  # too late: nothing changes
    assert first.result() is table


@pytest.mark.parametrize("masks_outcome", [None, RuntimeError("a bug")])
def test_no_first_masks_of_a_whole_compile_means_waiting_for_it(masks_outcome) -> None:
    cache, compiles, masks = held_cache()
    cache.fetch(NUMBER)
    first = fetch_first(cache, NUMBER)
    future = masks.futures[NUMBER.key_material()]
    if masks_outcome is None:
        future.set_result(None)
    else:
        future.set_exception(masks_outcome)
    assert not first.done()
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table


def test_a_first_compile_that_made_the_whole_table_keeps_it() -> None:
    """No LazyTable serves the constraint: the FIRST compile went on to the table."""
    cache, compiles, masks = held_cache()
    first = fetch_first(cache, NUMBER)
    table = compile_constraint(NUMBER, BYTES)
    masks.compiled[NUMBER.key_material()].set_result(table)
    assert first.result(timeout=5) is table
    whole = cache.fetch(NUMBER)
    assert whole.done() and whole.result() is table and not compiles.futures


def test_no_lazy_table_after_all_means_the_whole_compile() -> None:
    cache, compiles, masks = held_cache()
    first = fetch_first(cache, NUMBER)
    masks.compiled[NUMBER.key_material()].set_result(None)
    wait_for(lambda: NUMBER.key_material() in compiles.futures)
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table


def test_a_failed_first_compile_is_the_tables_failure_too() -> None:
    cache, compiles, masks = held_cache()
    first = fetch_first(cache, NUMBER)
    masks.compiled[NUMBER.key_material()].set_exception(ConstraintError("no output"))
    with pytest.raises(ConstraintError, match="no output"):
        first.result(timeout=5)
    # Remembered: the next requests are refused at once, with no compile.
    with pytest.raises(ConstraintError):
        fetch_first(cache, NUMBER).result(timeout=0)
    with pytest.raises(ConstraintError):
        cache.fetch(NUMBER).result(timeout=0)
    assert not compiles.futures and not masks.asked


def test_an_expired_failure_is_compiled_again_for_first_masks() -> None:
    """A failure that is not a compile limit is forgotten after negative_ttl_s; the next
    request then asks for a FIRST compile again, not for the whole table."""
    cache, compiles, masks = held_cache(negative_ttl_s=0.0)
    first = fetch_first(cache, NUMBER)
    masks.compiled.pop(NUMBER.key_material()).set_exception(ConstraintError("flaky"))
    with pytest.raises(ConstraintError):
        first.result(timeout=5)
    again = fetch_first(cache, NUMBER)
    lazy = masks.land_first(NUMBER)
    assert again.result(timeout=5) is lazy and not compiles.futures


def test_a_first_compiles_dfa_outlives_a_restart_on_disk(tmp_path) -> None:
    """The byte DFA is kept beside the tables on disk: after a restart the first request
    starts on it with no compile; a damaged file is compiled again."""
    cache, _, masks = held_cache(disk_dir=tmp_path)
    first = fetch_first(cache, NUMBER)
    lazy = masks.land_first(NUMBER)
    assert first.result(timeout=5) is lazy
    restarted, compiles, masks = held_cache(disk_dir=tmp_path)
    again = fetch_first(restarted, NUMBER).result(timeout=5)
    assert isinstance(again, LazyTable) and not masks.compiled and not compiles.futures
    assert np.array_equal(again.row(again.initial, 9), lazy.row(lazy.initial, 9))
    assert restarted.stats.disk_hits == 1
    for path in tmp_path.glob("*first*"):
        path.write_bytes(b"not an npz")
    damaged, _, masks = held_cache(disk_dir=tmp_path)
    answer = fetch_first(damaged, NUMBER)
    wait_for(lambda: NUMBER.key_material() in masks.compiled)
    compiled_again = masks.land_first(NUMBER)
    assert answer.result(timeout=5) is compiled_again


def test_a_whole_table_on_disk_replaces_the_dfa_file(tmp_path) -> None:
    """Once the whole table is written, the schema's DFA file goes: the table answers
    first masks too after a restart."""
    cache, compiles, masks = held_cache(disk_dir=tmp_path)
    fetch_first(cache, NUMBER)
    masks.land_first(NUMBER)
    wait_for(lambda: any(tmp_path.glob("*first*")))
    whole = cache.fetch(NUMBER)
    table = compiles.land(NUMBER)
    assert whole.result(timeout=5) is table
    wait_for(lambda: not any(tmp_path.glob("*first*")))
    restarted, compiles, masks = held_cache(disk_dir=tmp_path)
    again = fetch_first(restarted, NUMBER).result(timeout=5)
    assert isinstance(again, CompiledTable) and not masks.compiled and not compiles.futures


def test_a_whole_compile_past_its_limit_leaves_the_lazy_table_serving() -> None:
    """The whole table is refused (a tight budget cannot have it), generous requests go
    on with the LazyTable that was made before."""
    cache, compiles, masks = held_cache()
    fetch_first(cache, NUMBER)
    lazy = masks.land_first(NUMBER)
    whole = cache.fetch(NUMBER)
    compiles.futures[NUMBER.key_material()].set_exception(CompileLimitError("too costly"))
    with pytest.raises(CompileLimitError):
        whole.result(timeout=5)
    assert fetch_first(cache, NUMBER).result(timeout=0) is lazy
    with pytest.raises(CompileLimitError):
        cache.fetch(NUMBER).result(timeout=0)


def test_a_busy_first_compile_lands_for_the_retry() -> None:
    cache, compiles, masks = held_cache()
    first = fetch_first(cache, NUMBER)
    sent = masks.compiled[NUMBER.key_material()]
    going_on = sent.outcome  # the compile goes on past the 429
    sent.set_exception(CompilerBusyError("still compiling", 3.0))
    with pytest.raises(CompilerBusyError):
        first.result(timeout=5)
    lazy = LazyTable(dfa_of(NUMBER), BYTES)
    going_on.set_result(lazy)
    wait_for(lambda: cache.gauges()["table_cache_entries"] == 1)
    retry = fetch_first(cache, NUMBER)
    assert retry.done() and retry.result() is lazy


def test_a_lazy_table_counts_against_the_memory_budget() -> None:
    other = Constraint.regex(r'\{"a": [a-c]{1,3}\}')
    sizes = [LazyTable(dfa_of(c), BYTES).nbytes for c in (NUMBER, other)]
    cache, _, masks = held_cache(max_bytes=sum(sizes) - 1)  # room for either, not both
    for constraint in (NUMBER, other):
        answer = fetch_first(cache, constraint)
        masks.land_first(constraint)
        answer.result(timeout=5)  # kept before it is answered
    assert cache.gauges()["table_cache_entries"] == 1  # the older one was evicted
    assert cache.stats.evictions == 1


def wait_for(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


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


def test_a_first_compile_sends_the_byte_dfa_alone(embedded_vocab) -> None:
    """A real worker: a FIRST compile answers with the byte DFA, no walk, and its LazyTable's
    first mask is the compiled table's."""
    constraint = Constraint.json_schema(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=120), workers=1)
    first = FirstMasks(pool.early_dfa, embedded_vocab, pool.submit_first)
    try:
        lazy = first.compile(constraint).result(timeout=120)
        assert isinstance(lazy, LazyTable) and lazy.compile_seconds > 0
        expected = dfa_of(constraint).next
        assert lazy._trans.shape[1] < 256  # sent compact: a column per class of bytes
        assert np.array_equal(lazy._trans[:, lazy._columns], expected)
        table = compile_constraint(constraint, embedded_vocab)
        row = mask_table(table).row(table.initial, 64)
        assert np.array_equal(lazy.row(lazy.initial, 64), row)
    finally:
        first.close()
        pool.close()


def test_a_first_compile_no_lazy_table_serves_gives_the_whole_table() -> None:
    """ "b" is no token by itself: the FIRST compile goes on to the whole table."""
    letters = TokenVocabulary((b"ab", b"a", None), eos_token_id=2, scheme="plain")
    constraint = Constraint.regex("ab")
    pool = CompilerPool(letters, CompileLimits(timeout_s=120), workers=1)
    first = FirstMasks(pool.early_dfa, letters, pool.submit_first)
    try:
        table = first.compile(constraint).result(timeout=120)
        assert isinstance(table, CompiledTable)
        assert mask_table(table).row(table.initial, 4).view(np.uint32)[0] & 1  # "ab"
    finally:
        first.close()
        pool.close()


def test_a_first_compile_over_the_state_limit_is_the_whole_compiles_refusal(
    embedded_vocab,
) -> None:
    constraint = Constraint.json_schema({"type": "string", "maxLength": 50})
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=120, max_states=20), workers=1)
    first = FirstMasks(pool.early_dfa, embedded_vocab, pool.submit_first)
    try:
        with pytest.raises(CompileLimitError):
            first.compile(constraint).result(timeout=120)
    finally:
        first.close()
        pool.close()


def test_a_first_compile_serves_a_dfa_past_the_early_limit(embedded_vocab) -> None:
    """A whole compile sends its DFA ahead only up to EARLY_DFA_MAX_STATES states; a FIRST
    compile sends it compact up to the state limit, so large DFAs start on first masks too."""
    constraint = Constraint.json_schema({"type": "string", "minLength": 2100, "maxLength": 2200})
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=120), workers=1)
    first = FirstMasks(pool.early_dfa, embedded_vocab, pool.submit_first)
    try:
        lazy = first.compile(constraint).result(timeout=120)
        assert isinstance(lazy, LazyTable)
        assert lazy._trans.shape[0] > EARLY_DFA_MAX_STATES
        allowed = unpack_row(ConstraintState(lazy).allowed_row(4000))
        assert allowed.size and all(embedded_vocab.token_bytes[t][:1] == b'"' for t in allowed)
    finally:
        first.close()
        pool.close()


def no_worker(constraint: Constraint) -> Future[object]:
    raise AssertionError(f"{constraint} went to a worker")


def test_a_grown_first_compile_needs_no_worker(embedded_vocab) -> None:
    """With `grow`, the NFA is built here and the DFA grows as walks read it: no worker,
    the compiled table's masks, a grown table counted for /metrics."""
    constraint = Constraint.json_schema(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    )
    first = FirstMasks(lambda c: None, embedded_vocab, no_worker, grow=True)
    try:
        lazy = first.compile(constraint).result(timeout=60)
        assert isinstance(lazy, GrowingLazyTable) and lazy.compile_seconds > 0
        table = compile_constraint(constraint, embedded_vocab)
        for left in (table.min_tokens, 64):
            row = mask_table(table).row(table.initial, left)
            assert np.array_equal(lazy.row(lazy.initial, left), row)
        assert lazy.min_tokens == table.min_tokens
        assert lazy.stored_dfa() is None  # nothing for the disk: it grows again in ms
        gauges = first.gauges()
        assert gauges["first_masks_grown"] == 1 and gauges["first_mask_grow_seconds"] > 0
    finally:
        first.close()


def test_a_recursive_grammar_grows_a_pushdown_table_on_the_heavy_lane_when_slow(
    embedded_vocab, monkeypatch
) -> None:
    """A `pushdown` grammar's table is built here, no worker; a build that passes the light
    lane's deadline is made again on the heavy lane, with its longer one; one that passes
    that too is unrolled into its regex (a GrowingLazyTable)."""
    from gclm.compiler.front.deadline import OutOfTime
    from gclm.compiler.grown.pushdown import PushdownTable

    constraint = replace(Constraint.grammar('start: t\nt: "(" t ")" | "x"'), pushdown=True)
    build = PushdownTable.of_constraint
    for slow_builds, kind in ((0, PushdownTable), (1, PushdownTable), (2, GrowingLazyTable)):
        calls: list[int] = []

        def slow(
            c: Constraint, vocab: TokenVocabulary, *, n: int = slow_builds, calls: list[int] = calls
        ) -> object:
            calls.append(1)
            if len(calls) <= n:
                raise OutOfTime("slow")
            return build(c, vocab)

        monkeypatch.setattr(PushdownTable, "of_constraint", staticmethod(slow))
        first = FirstMasks(lambda c: None, embedded_vocab, no_worker, grow=True)
        try:
            made = first.compile(constraint).result(timeout=60)
            assert isinstance(made, kind), (slow_builds, made)
            assert len(calls) == min(slow_builds + 1, 2)
        finally:
            first.close()


@pytest.mark.parametrize(
    "constraint, vocab",
    [
        (Constraint.regex(r"\d{2}"), None),  # `\d`: not in the compiled parser's dialect
        (Constraint.regex("ab"), TokenVocabulary((b"ab", b"a", None), 2, scheme="plain")),
    ],
    ids=["unparsed", "unservable"],
)
def test_what_does_not_grow_goes_to_a_worker(constraint, vocab, embedded_vocab) -> None:
    """A regex the parser refuses gets the worker's byte DFA; one that no LazyTable serves
    ("b" is no token by itself) the worker's whole table, as without `grow`."""
    vocab = vocab or embedded_vocab
    pool = CompilerPool(vocab, CompileLimits(timeout_s=120), workers=1)
    first = FirstMasks(pool.early_dfa, vocab, pool.submit_first, grow=True)
    try:
        made = first.compile(constraint).result(timeout=120)
        assert not isinstance(made, GrowingLazyTable)
        assert isinstance(made, LazyTable if vocab is embedded_vocab else CompiledTable)
        assert first.gauges()["first_masks_grown"] == 0
        assert pool.gauges()["first_compiles_started"] == 1
    finally:
        first.close()
        pool.close()


def test_a_schema_to_regex_refuses_gets_the_workers_error(embedded_vocab, caplog) -> None:
    """to_regex's refusal is no bug of the growth: the worker's compile gives the request
    its 400, and nothing is logged as an exception."""
    constraint = Constraint.json_schema({"type": "string", "pattern": "^a(?=b)"})
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=120), workers=1)
    first = FirstMasks(pool.early_dfa, embedded_vocab, pool.submit_first, grow=True)
    try:
        with pytest.raises(ConstraintError, match="look"):
            first.compile(constraint).result(timeout=120)
        assert not [r for r in caplog.records if r.exc_info]
    finally:
        first.close()
        pool.close()


def test_a_busy_worker_answers_a_refused_growth_with_its_429() -> None:
    """Where the fallback's worker is busy, the request gets its CompilerBusyError, never
    a future left unanswered."""

    def busy(constraint: Constraint) -> Compiling[object]:
        return Compiling.ended(CompilerBusyError("busy", retry_after=1.0))

    first = FirstMasks(lambda c: None, BYTES, busy, grow=True)
    try:
        with pytest.raises(CompilerBusyError):
            first.compile(Constraint.regex(r"\d")).result(timeout=30)
    finally:
        first.close()


def test_cancelling_a_first_compile_cancels_the_workers_compile_behind_it() -> None:
    # TableCache.abandon cancels what FirstMasks.compile handed it; the pool stops a
    # compile whose every waiter is cancelled.
    sent: list[Compiling] = []

    def submit_first(constraint: Constraint) -> Compiling:
        sent.append(Compiling())
        return sent[-1]

    first = FirstMasks(lambda constraint: None, BYTES, submit_first)  # no grow lanes
    try:
        out = first.compile(Constraint.regex("[a-z]+"))
        assert len(sent) == 1 and not out.done()
        assert out.cancel()
        assert sent[0].cancelled()
    finally:
        first.close()


def test_a_grow_whose_requests_all_left_while_it_queued_is_not_grown() -> None:
    first = FirstMasks(lambda constraint: None, BYTES, lambda c: Compiling(), grow=True)
    try:
        gate = first._grower.submit(time.sleep, 0.3)  # the lane is busy meanwhile
        out = first.compile(Constraint.regex("[a-z]+"))
        assert out.cancel()
        gate.result(timeout=5)
        first._grower.submit(lambda: None).result(timeout=5)  # the queued grow has run
        assert first.grown == 0
    finally:
        first.close()


def test_a_whole_compile_a_first_mask_request_joined_is_never_abandoned() -> None:
    # Its requests are counted on the future made of it (the LazyTable or the table,
    # whichever comes first): one waiting on the whole compile itself that leaves must
    # not stop it under them.
    cache, compiles, masks = held_cache()
    whole = cache.fetch(NUMBER)
    first = fetch_first(cache, NUMBER)
    assert first is not whole
    assert not cache.abandon(whole)
    assert not compiles.futures[NUMBER.key_material()].cancelled()
    table = compiles.land(NUMBER)
    assert first.result(timeout=5) is table


def test_a_first_compile_that_every_request_left_is_cancelled_and_compiled_anew() -> None:
    cache, compiles, masks = held_cache()
    first = fetch_first(cache, NUMBER)
    assert cache.abandon(first)
    assert masks.compiled[NUMBER.key_material()].cancelled()
    error = first.exception(timeout=5)
    assert isinstance(error, CompilerBusyError) and "every request" in error.message
    del masks.compiled[NUMBER.key_material()]  # the fake allows one FIRST compile each
    again = fetch_first(cache, NUMBER)
    assert again is not first and not again.done()
    assert masks.land_first(NUMBER) is again.result(timeout=5)


# Run in a process of its own: in this one, earlier tests have loaded functions already.
WARM_UP_COVERS_A_REQUEST = r"""
import importlib, json, pkgutil

import gclm.compiler
from numba.core.registry import CPUDispatcher

from gclm.compiler.front.constraint import parse_constraint
from gclm.compiler.service.first_mask import warm_up
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.server.engine.model_loader import load_tokenizer


def specialisations():
    out = {}
    for module in pkgutil.walk_packages(gclm.compiler.__path__, "gclm.compiler."):
        if module.name.endswith((".warm", ".worker")):  # import-time effects: not the server's
            continue
        loaded = importlib.import_module(module.name)
        for name, value in vars(loaded).items():
            if isinstance(value, CPUDispatcher) and value.__module__ == loaded.__name__:
                out[f"{loaded.__name__}.{name}"] = len(value.signatures)
    return out


vocab = TokenVocabulary.from_tokenizer(load_tokenizer(None))
before = specialisations()
words = [bytes([b]) for b in range(256)] + [b"ab", b'{"']
warm_up(TokenVocabulary((*words, None), len(words), "plain"))  # as the image's build does
warmed = specialisations()
person = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "\u00e9", "\u4e20"]}},
    },
    "required": ["name", "age"],
}
for spec in (
    {"type": "json_schema", "json_schema": {"name": "p", "schema": person}},
    {"type": "json_object"},
    {"regex": "[\u00e9-\u4e00]+[0-9]{3}(a|b)*A"},
    {"choice": ["yes", "no"]},
    {"grammar": 'start: "a" b\nb: /[0-9]+/'},
):
    table = GrowingLazyTable.of_regex(to_regex(parse_constraint(spec)).regex, vocab)
    assert table.request_fits(64) and table.request_minimum() > 0
    table.forward_row(table.initial)
    table.spelled_upper(table.initial)
print(json.dumps({"before": sum(before.values()), "warmed": warmed, "after": specialisations()}))
"""


def test_the_warm_up_compiles_every_function_a_grow_and_a_request_use() -> None:
    # The server waits for the warm-up before it serves (server/launch.py) and the image's
    # build runs it (Dockerfile): whatever a request's grow compiles after it is numba
    # compiling on a cold cache while the request's --compile-timeout runs (45-60 s on a
    # 2-core machine: a 429 for the first request of a new container).
    import json
    import subprocess
    import sys

    ran = subprocess.run(
        [sys.executable, "-c", WARM_UP_COVERS_A_REQUEST],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["before"] == 0  # nothing compiled at import: the warm-up loads them all
    assert sum(seen["warmed"].values()) > 10
    assert seen["after"] == seen["warmed"]
