"""compiler/grown/lazy_table.py: masks walked state by state give the whole table's masks,
exactly."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.grown.byte_bounds import byte_bounds, single_byte_tokens
from gclm.compiler.grown.lazy_table import LazyTable
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.byte_dfa import ByteDfa, byte_dfa
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.compiler.whole.token_sets import unpack_row
from gclm.errors import BudgetTooSmallError, InternalError
from gclm.masking import ConstraintState, check_budget

STR = {"type": "string", "maxLength": 6}
CONSTRAINTS = {
    "digits": Constraint.regex(r"[0-9]{2,4}-(yes|no)"),
    "unicode": Constraint.regex(r"[^a]{1,8}(é|日本)"),
    "object": Constraint.json_schema(
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 12},
                "n": {"type": "integer", "minimum": -5},
                "tags": {"type": "array", "items": {"enum": ["a", "b c", "ü"]}, "maxItems": 3},
            },
            "required": ["name", "n"],
        }
    ),
}


def lazy_table(constraint: Constraint, vocab: TokenVocabulary) -> LazyTable:
    return LazyTable(byte_dfa(to_regex(constraint).regex), vocab)


def walk_both(
    exact: CompiledTable, lazy: LazyTable, budget: int, rng: np.random.Generator
) -> list[int]:
    """Sample one output within `budget` from the lazy masks, checking at every step that the
    lazy and the exact masks are the same row and the bounds hold. Returns its tokens."""
    ex, lz = ConstraintState(exact), ConstraintState(lazy)
    tokens: list[int] = []
    left = budget
    while not ex.must_stop(left):
        assert lz.must_stop(left) is False
        exact_dist = exact.dist[ex.state]
        assert lazy.lower[lz.state] <= exact_dist <= lazy.upper[lz.state]
        if rng.random() < 0.5:  # else the row's own search asks for it, or does not
            assert exact_dist <= lazy.spelled_upper(lz.state) <= lazy.upper[lz.state]
        row = lz.allowed_row(left)
        assert np.array_equal(row, ex.allowed_row(left)), f"after {tokens}, {left} left"
        allowed = unpack_row(row)
        token = int(rng.choice(allowed))
        if token == exact.eos_token_id:
            break
        ex.advance(token, left)
        lz.advance(token, left)
        assert lz.is_accepting == ex.is_accepting
        tokens.append(token)
        left -= 1
    assert ex.is_accepting and len(tokens) <= budget
    return tokens


@pytest.mark.parametrize("constraint", CONSTRAINTS.values(), ids=CONSTRAINTS.keys())
def test_lazy_masks_equal_the_whole_tables(constraint, embedded_vocab):
    exact = compile_constraint(constraint, embedded_vocab)
    rng = np.random.default_rng(0)
    for extra in (0, 0, 1, 2, 5, 40, 4000):
        lazy = lazy_table(constraint, embedded_vocab)  # fresh: nothing walked or searched
        budget = exact.min_tokens + extra
        check_budget(lazy, budget)
        walk_both(exact, lazy, budget, rng)
    assert lazy.min_tokens == exact.min_tokens


def test_the_first_mask_walks_one_state(embedded_vocab):
    constraint = CONSTRAINTS["object"]
    exact = compile_constraint(constraint, embedded_vocab)
    lazy = lazy_table(constraint, embedded_vocab)
    check_budget(lazy, 4096)  # the upper bound fits: no exact distance needed
    state = ConstraintState(lazy)
    row = state.allowed_row(4096)
    assert lazy.num_walked == 1 < exact.num_states
    assert np.array_equal(row, ConstraintState(exact).allowed_row(4096))


def test_a_tight_budget_gets_the_exact_minimum_before_any_whole_table(embedded_vocab):
    # The exact table is never built here: the lazy table finds the minimum by a search.
    constraint = Constraint.json_schema({"type": "object", "properties": {"key": STR}})
    lazy = lazy_table(constraint, embedded_vocab)
    exact = compile_constraint(constraint, embedded_vocab)
    need = exact.min_tokens
    assert lazy.upper[lazy.initial] > need  # byte by byte is longer than the best tokens
    with pytest.raises(BudgetTooSmallError) as caught:
        check_budget(lazy, need - 1)
    assert caught.value.min_tokens == need
    fresh = lazy_table(constraint, embedded_vocab)
    check_budget(fresh, need)  # the exact minimum itself is enough
    walk_both(exact, fresh, need, np.random.default_rng(1))


def spelling_vocab() -> TokenVocabulary:
    # Every byte is a token by itself, plus two longer tokens and EOS (id 258).
    tokens = (*(bytes([b]) for b in range(256)), b'{"a": ', b"}", None)
    return TokenVocabulary(tokens, eos_token_id=258, scheme="plain")


@pytest.mark.parametrize("table", ["whole DFA", "grown DFA"])
def test_a_budget_below_the_byte_bound_is_passed_by_the_spelled_one(table):
    from gclm.compiler.grown.lazy_dfa import GrowingLazyTable

    vocab, regex = spelling_vocab(), r'\{"a": [0-9]{1,3}\}'
    if table == "whole DFA":
        lazy = LazyTable(byte_dfa(regex), vocab)
    else:
        lazy = GrowingLazyTable.of_regex(regex, vocab)
    assert lazy.upper[lazy.initial] == 8  # '{"a": 0}' a byte a token
    assert lazy.spelled_upper(lazy.initial) == 3  # '{"a": ', '0', '}'
    check_budget(lazy, 3)
    assert lazy.num_walked == 0  # no search over the token graph was needed
    with pytest.raises(BudgetTooSmallError) as caught:
        check_budget(lazy, 2)
    assert caught.value.min_tokens == 3


def test_the_spelled_bound_proves_a_request_generous_without_a_search():
    from gclm.masking.graceful import GracefulPolicy

    vocab = spelling_vocab()
    policy = GracefulPolicy.for_vocab(vocab.token_bytes)
    lazy = LazyTable(byte_dfa(r'\{"a": [0-9]{1,3}\}'), vocab)
    budget = 3 + int(policy.generous)  # generous by the spelled bound, not by the byte one
    assert budget - lazy.upper[lazy.initial] < policy.generous
    assert policy.serves_lazily(lazy, budget)
    assert lazy.num_walked == 0
    assert not policy.serves_lazily(lazy, budget - 1)  # the exact minimum is 3


def test_the_fewest_tokens_spelling_bytes_are_found_not_the_greedy_ones():
    from gclm.compiler.grown.path_bound import fewest_tokens
    from gclm.compiler.vocab.trie import token_trie

    tokens = (b"a", b"b", b"c", b"d", b"ab", b"bcd", None)
    trie = token_trie(TokenVocabulary(tokens, eos_token_id=6, scheme="plain"))
    spell = lambda text: fewest_tokens(np.frombuffer(text, dtype=np.uint8), trie)  # noqa: E731
    assert spell(b"abcd") == 2  # 'a', 'bcd'; longest first would take 'ab', 'c', 'd'
    assert spell(b"abab") == 2
    assert spell(b"dcba") == 4


def test_a_row_past_the_budget_raises(embedded_vocab):
    lazy = lazy_table(CONSTRAINTS["digits"], embedded_vocab)
    with pytest.raises(InternalError, match="No token is allowed"):
        ConstraintState(lazy).allowed_row(1)


def test_a_missing_single_byte_token_is_refused():
    # "é" is only spelled by a two-byte token: byte distances prove no token path.
    token_bytes = (b"a", "é".encode(), None)
    vocab = TokenVocabulary(token_bytes, eos_token_id=2, scheme="plain")
    assert single_byte_tokens(vocab).sum() == 1
    with pytest.raises(ValueError, match="compile its whole table"):
        lazy_table(Constraint.regex("aé"), vocab)


# Random small JSON schemas: strings, integers, enums, booleans, short arrays, nested objects.
leaves = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
    st.builds(lambda lo: {"type": "integer", "minimum": lo}, st.integers(-20, 20)),
    st.just({"type": "boolean"}),
    st.builds(
        lambda xs: {"enum": xs},
        st.lists(st.text("ab é1", min_size=1, max_size=4), min_size=1, max_size=3, unique=True),
    ),
)
schemas = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.builds(
            lambda props, req: {
                "type": "object",
                "properties": props,
                "required": sorted(set(req) & set(props)),
                "additionalProperties": False,
            },
            st.dictionaries(st.sampled_from(["a", "bb", "ccc"]), inner, max_size=3),
            st.lists(st.sampled_from(["a", "bb", "ccc"])),
        ),
        st.builds(
            lambda item, n: {"type": "array", "items": item, "maxItems": n},
            inner,
            st.integers(0, 3),
        ),
    ),
    max_leaves=4,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schema=schemas, extra=st.integers(0, 12), seed=st.integers(0, 2**32 - 1))
def test_random_schemas_and_budgets(schema, extra, seed, embedded_vocab):
    constraint = Constraint.json_schema(schema)
    exact = compile_constraint(constraint, embedded_vocab)
    lazy = lazy_table(constraint, embedded_vocab)
    budget = exact.min_tokens + extra
    check_budget(lazy, budget)
    with pytest.raises(BudgetTooSmallError) as caught:
        check_budget(lazy_table(constraint, embedded_vocab), exact.min_tokens - 1)
    assert caught.value.min_tokens == exact.min_tokens
    walk_both(exact, lazy, budget, np.random.default_rng(seed))


def test_the_200k_vocabulary_round_trips_and_spells_every_byte(o200k_tokenizer, o200k_vocab):
    from bench.o200k import ROUND_TRIP

    for text in ROUND_TRIP:
        ids = o200k_tokenizer.encode(text, add_special_tokens=False)
        assert o200k_tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text
        assert o200k_vocab.decode(ids) == text
    assert o200k_vocab.size >= 199_998 and o200k_vocab.scheme == "byte_level"
    assert single_byte_tokens(o200k_vocab).all()


def test_lazy_masks_equal_the_whole_tables_at_200k(o200k_vocab):
    constraint = CONSTRAINTS["object"]
    exact = compile_constraint(constraint, o200k_vocab)
    rng = np.random.default_rng(2)
    for extra in (0, 3, 4000):
        lazy = lazy_table(constraint, o200k_vocab)
        check_budget(lazy, exact.min_tokens + extra)
        walk_both(exact, lazy, exact.min_tokens + extra, rng)
    assert lazy.num_walked < exact.num_states


def test_threads_share_one_lazy_table(embedded_vocab):
    constraint = CONSTRAINTS["object"]
    exact = compile_constraint(constraint, embedded_vocab)
    lazy = lazy_table(constraint, embedded_vocab)
    outputs: list[list[int]] = []

    def run(seed: int) -> None:
        for extra in (0, 2, 50):
            outputs.append(
                walk_both(exact, lazy, exact.min_tokens + extra, np.random.default_rng(seed))
            )

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outputs) == 12  # a thread that failed an assertion appended fewer


def test_graceful_closure_is_silent_on_a_generous_lazy_request_as_on_the_whole_table(
    embedded_vocab,
):
    import torch

    from gclm.masking import allocate_bitmask, apply_bitmask, fill_bitmask
    from gclm.masking.graceful import GracefulPolicy

    constraint = CONSTRAINTS["object"]
    exact = compile_constraint(constraint, embedded_vocab)
    policy = GracefulPolicy.for_vocab(embedded_vocab.token_bytes)
    generous = exact.min_tokens + int(policy.generous)
    outputs = []
    for table in (exact, lazy_table(constraint, embedded_vocab)):
        state = ConstraintState(table)
        bitmask = allocate_bitmask(1, embedded_vocab.size)
        fill_bitmask(bitmask, 0, state, generous)
        logits = torch.randn(1, embedded_vocab.size, generator=torch.Generator().manual_seed(0))
        apply_bitmask(logits, bitmask)
        before = logits.clone()
        policy.adjust(logits[0], state, generous, generous)
        assert torch.equal(logits, before)
        outputs.append(logits)
    assert torch.equal(outputs[0], outputs[1])
    # A tight request needs the whole table's plan: refused, not silently left unpaced.
    tight = exact.min_tokens + 3
    lazy_state = ConstraintState(lazy_table(constraint, embedded_vocab))
    with pytest.raises(TypeError, match="whole compiled table"):
        policy.adjust(torch.zeros(embedded_vocab.size), lazy_state, tight, tight)
    exact_logits = torch.zeros(embedded_vocab.size)
    fill = allocate_bitmask(1, embedded_vocab.size)
    fill_bitmask(fill, 0, ConstraintState(exact), tight)
    apply_bitmask(exact_logits[None], fill)
    policy.adjust(exact_logits, ConstraintState(exact), tight, tight)  # the whole table paces


def test_walked_groups_are_stored_small_and_shared(embedded_vocab):
    """A group of fewer tokens than a packed row's words is kept as their ids, a larger one
    as a packed row shared with every equal row, as forward rows are; the masks are
    unchanged (the tests above) and the next states follow from either."""
    lazy = lazy_table(Constraint.regex(r"x[a-z]{1,40}"), embedded_vocab)
    x, a = embedded_vocab.token_bytes.index(b"x"), embedded_vocab.token_bytes.index(b"a")
    states = [lazy.initial, lazy.next_state(lazy.initial, x)]
    for _ in range(3):  # "xaaa": 37 or more letters left, every letter token fits
        states.append(lazy.next_state(states[-1], a))
    walked = [lazy.walked(s) for s in states]
    shared = {id(row) for same in lazy._rows.values() for row in same}
    for state, w in zip(states, walked, strict=True):
        for g, group in enumerate(w.groups):
            if group.dtype == np.int32:
                assert group.size < lazy.width and np.all(np.diff(group) > 0)
                token = int(group[0])
            else:
                assert group.dtype == np.uint32 and id(group) in shared
                token = int(unpack_row(group.view(np.int32))[0])
            assert lazy.next_state(state, token) == w.next_list[g]
    assert walked[3].forward is walked[4].forward  # equal rows, one copy
    assert any(g.dtype == np.uint32 for g in walked[3].groups)
    # What it holds, counted as it walks: the DFA and bounds, the groups, the shared rows.
    held = {id(g): g.nbytes for w in lazy._walked.values() for g in (*w.groups, w.forward)}
    nexts = sum(
        w.nexts.nbytes + w.sparse_ids.nbytes + w.sparse_group.nbytes for w in lazy._walked.values()
    )
    fixed = lazy._trans.nbytes + lazy._accepting.nbytes + 2 * lazy.upper.nbytes
    fixed += lazy._built.nbytes
    fixed += lazy._stamp.nbytes + lazy._slot.nbytes
    assert lazy.nbytes == fixed + nexts + sum(held.values())


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
def test_a_compact_dfa_gives_the_same_bounds_and_masks(name, embedded_vocab):
    """A column per class of bytes (what a FIRST compile sends): the same DFA."""
    dense = byte_dfa(to_regex(CONSTRAINTS[name]).regex)
    compact = dense.compact()
    assert compact.next.shape[1] < 256
    assert np.array_equal(compact.next[:, compact.columns], dense.next)
    spelled = single_byte_tokens(embedded_vocab)
    for a, b in zip(byte_bounds(dense, spelled), byte_bounds(compact, spelled), strict=True):
        assert np.array_equal(a, b)
    stored = ByteDfa.from_bytes(compact.to_bytes())  # as the table cache's disk keeps it
    assert np.array_equal(stored.next, compact.next) and np.array_equal(
        stored.columns, compact.columns
    )
    exact = compile_constraint(CONSTRAINTS[name], embedded_vocab)
    lazy = LazyTable(stored, embedded_vocab)
    for seed in range(3):
        walk_both(exact, lazy, 40, np.random.default_rng(seed))


def test_a_bytes_class_is_spelled_if_one_of_its_bytes_is():
    """ "a" and "b" share a column; "a" alone a token is enough for the upper bound, as
    for the dense DFA."""
    letters = TokenVocabulary((b"a", b"ab", None), eos_token_id=2, scheme="plain")
    dense = byte_dfa("[ab]{2,3}")
    compact = dense.compact()
    assert compact.classes is not None and compact.classes[ord("a")] == compact.classes[ord("b")]
    spelled = single_byte_tokens(letters)
    assert np.array_equal(byte_bounds(dense, spelled)[1], byte_bounds(compact, spelled)[1])
    assert byte_bounds(compact, spelled)[1][0] == 2
