"""The walls of in-process compile work (issue 55): what input controls is bounded by an
explicit limit that answers with a CompileLimitError (a 400), never a RecursionError, and
the searches and grows a request starts in the server's process are bounded too."""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.grammar import grammar_regex, python_regex
from gclm.compiler.front.grammar.syntax import MAX_GRAMMAR_CHARS, MAX_NESTING
from gclm.compiler.front.regex import MAX_SCHEMA_DEPTH, to_regex
from gclm.compiler.grown.lazy_dfa import GrowingLazyTable
from gclm.compiler.grown.lazy_table import REQUEST_SEARCH_STATES, SearchTooLarge
from gclm.compiler.service.compile_job import Compiling
from gclm.compiler.service.first_mask import LIGHT_LANE_DEPTH, LIGHT_NFA_STATES, FirstMasks
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.errors import CompileLimitError

# Every byte a token by itself, and EOS (id 256).
BYTES = TokenVocabulary((*(bytes([b]) for b in range(256)), None), eos_token_id=256, scheme="plain")


def groups(depth: int) -> str:
    return "start: " + "(" * depth + '"a"' + ")" * depth


def rule_chain(n: int) -> str:
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n - 1)) + f'r{n - 1}: "x"'


def terminal_chain(n: int) -> str:
    return "start: T0\n" + "".join(f"T{i}: T{i + 1}\n" for i in range(n - 1)) + f'T{n - 1}: "x"'


@pytest.mark.parametrize(
    "deep, ok",
    [(groups, groups), (rule_chain, rule_chain), (terminal_chain, terminal_chain)],
    ids=["groups", "rules", "terminals"],
)
def test_grammar_nesting_past_the_limit_is_a_compile_limit(deep, ok) -> None:
    assert grammar_regex(ok(MAX_NESTING - 2)).regex
    with pytest.raises(CompileLimitError, match=f"more than {MAX_NESTING} deep"):
        grammar_regex(deep(MAX_NESTING + 1))
    with pytest.raises(CompileLimitError, match="deep"):  # far past: still no RecursionError
        grammar_regex(deep(5000 if deep is groups else 3000))


def test_a_grammar_longer_than_the_limit_is_refused_before_it_is_read() -> None:
    text = "start: " + " | ".join(f'"w{i}"' for i in range(MAX_GRAMMAR_CHARS // 6))
    assert len(text) > MAX_GRAMMAR_CHARS
    with pytest.raises(CompileLimitError, match=f"{MAX_GRAMMAR_CHARS:,}"):
        Constraint.grammar(text)


def test_case_insensitive_literals_match_what_pythons_re_matches() -> None:
    """The fast per-character classes are the ones the old scan of every cased character
    found (the scan is still there for classes: `_with_case`), on a sample of characters
    with case (the special ones included) and without."""
    special = [0x49, 0x69, 0x130, 0x131, 0x53, 0x17F, 0x4B, 0x212A, 0x390, 0x1FD3, 0x3B0, 0xDF]
    sample = special + list(range(0x20, 0x250, 3)) + list(range(0x370, 0x530, 11))
    for cp in sample:
        slow = python_regex._set_regex(python_regex._with_case([(cp, cp)], False, True))
        assert python_regex._case_variants(chr(cp)) == slow, hex(cp)


def test_a_long_case_insensitive_literal_is_one_class_a_character() -> None:
    regex = grammar_regex('start: "' + "ab" * 10_000 + '"i').regex
    assert regex.count("[Aa]") == 10_000 and regex.count("[Bb]") == 10_000


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_a_schema_nested_past_the_limit_is_a_compile_limit() -> None:
    with pytest.raises(CompileLimitError, match=f"more than {MAX_SCHEMA_DEPTH} levels"):
        to_regex(Constraint.json_schema(nested(MAX_SCHEMA_DEPTH)))


def test_a_ref_chain_past_pythons_stack_is_a_compile_limit_not_a_recursion_error() -> None:
    n = 3000
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    with pytest.raises(CompileLimitError, match="nests too deeply"):
        to_regex(Constraint.json_schema({"$defs": defs, "$ref": "#/$defs/d0"}))


def test_a_requests_search_for_the_minimum_is_bounded() -> None:
    """A chain of 3 * REQUEST_SEARCH_STATES bytes: the exact minimum is past the bound
    that a request's budget check may search (it then asks for the whole table), while a
    search without the bound (the engine's) still finds it."""
    n = 3 * REQUEST_SEARCH_STATES
    table = GrowingLazyTable.of_regex(f"(?:ab){{{n // 2}}}$", BYTES)
    assert not table.request_fits(10)  # the lower bound decides it: no search
    with pytest.raises(SearchTooLarge):
        table.request_minimum()
    assert table.min_tokens == n


def test_new_constraints_go_to_a_worker_while_the_grow_lane_is_full() -> None:
    """LIGHT_LANE_DEPTH grows queued or running: the next new constraint's first masks come
    from the worker pool (submit_first), not from a queue behind them."""
    release = threading.Event()
    sent: list[Constraint] = []
    worker = recording_worker(sent)
    first = FirstMasks(lambda c: None, BYTES, worker, grow=True)
    held = first._grow_here
    first._grow_here = lambda c, out, regex: (release.wait(30), held(c, out, regex))  # type: ignore[method-assign]
    try:
        growing = [first.compile(Constraint.regex(f"a{i}b")) for i in range(LIGHT_LANE_DEPTH)]
        first.compile(Constraint.regex("zz"))
        assert [c.spec for c in sent] == ["zz"]
        release.set()
        for future in growing:
            assert isinstance(future.result(timeout=30), GrowingLazyTable)
        first.compile(Constraint.regex("yy")).result(timeout=30)  # the lane is free again
        assert [c.spec for c in sent] == ["zz"]
    finally:
        release.set()
        first.close()


def test_a_large_nfa_grows_on_the_heavy_lane_and_a_small_one_does_not_wait_for_it() -> None:
    """An NFA past LIGHT_NFA_STATES leaves the light lane for the heavy one (still grown
    here, no worker); while it grows, a small constraint's table comes from the light lane."""
    first = FirstMasks(lambda c: None, BYTES, no_worker, grow=True)
    try:
        large = first.compile(Constraint.regex("(?:(?:ab){400}){150}"))  # 240 k NFA states
        small = first.compile(Constraint.regex("[0-9]{3}")).result(timeout=60)
        assert isinstance(small, GrowingLazyTable)
        table = large.result(timeout=120)
        assert isinstance(table, GrowingLazyTable)
        assert table.grown.nfa.states > LIGHT_NFA_STATES
        assert first.gauges()["first_masks_grown"] == 2
    finally:
        first.close()


def recording_worker(sent: list[Constraint]):  # type: ignore[no-untyped-def]
    """A pool's submit_first that records each constraint and answers None at once."""

    def worker(constraint: Constraint) -> Compiling[object]:
        sent.append(constraint)
        return Compiling.ended(None)

    return worker


def no_worker(constraint: Constraint) -> Future[object]:
    raise AssertionError(f"{constraint} went to a worker")


def test_the_limits_are_named_in_operations_docs() -> None:
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for limit in (MAX_GRAMMAR_CHARS, MAX_NESTING, MAX_SCHEMA_DEPTH, REQUEST_SEARCH_STATES):
        assert re.search(rf"\b{limit:,}\b|\b{limit}\b", page), limit


def test_a_requests_search_stops_at_its_deadline() -> None:
    """Within `request_deadline`, a search that the state bound would let finish stops at
    the request's deadline; outside it the same search finds the minimum."""
    import time

    from gclm.compiler.grown.lazy_table import request_deadline

    table = GrowingLazyTable.of_regex("(?:ab){40}$", BYTES)
    with request_deadline(time.monotonic() - 1), pytest.raises(SearchTooLarge):
        table.request_minimum()
    assert table.request_minimum() == 80


def test_writing_a_regex_stops_at_a_work_deadline_and_only_inside_one() -> None:
    """A schema whose normalisation takes minutes (MaskBench's WashingtonPost wp_124 has
    the same shape: oneOfs of arrays under $refs) stops at the server thread's deadline;
    the same code without a deadline (a worker's) is not stopped by it."""
    from gclm.compiler.front.deadline import OutOfTime, check, work_deadline

    schema = {"$defs": {}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a0"}}}
    for i in range(12):
        schema["$defs"][f"a{i}"] = {
            "oneOf": [
                {"type": "array", "items": {"$ref": f"#/$defs/a{i + 1}"}},
                {"type": "object", "properties": {"y": {"$ref": f"#/$defs/a{i + 1}"}}},
                {"type": "string"},
            ]
        }
    schema["$defs"]["a12"] = {"type": "integer"}
    with work_deadline(0.0), pytest.raises(OutOfTime):
        to_regex(Constraint.json_schema(schema))
    with work_deadline(-1.0), pytest.raises(OutOfTime):
        grammar_regex('start: "a" | b\nb: "c"')
    check()  # outside a deadline: nothing


def test_a_regex_slow_to_write_is_left_to_a_worker(monkeypatch) -> None:
    """Past LIGHT_REGEX_SECONDS (here 0) writing the regex on the light lane stops and a
    worker's FIRST compile answers: the lane is free for the next constraint."""
    monkeypatch.setattr("gclm.compiler.service.first_mask.LIGHT_REGEX_SECONDS", 0.0)
    sent: list[Constraint] = []
    worker = recording_worker(sent)
    first = FirstMasks(lambda c: None, BYTES, worker, grow=True)
    try:
        slow = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "string"}}})
        assert first.compile(slow).result(timeout=30) is None  # the worker's answer
        assert sent == [slow] and first.gauges()["first_masks_grown"] == 0
    finally:
        first.close()
