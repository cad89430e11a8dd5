"""bench/budget/forced.py: the fewest tokens of a non-degenerate output, proven both ways."""

from __future__ import annotations

import pytest

from bench.budget import run as budget
from bench.budget.forced import Fewest, Place, fewest_non_degenerate, slot_variants
from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.json_schema import normalize_schema
from gclm.compiler.whole.compile import compile_constraint

STR = {"type": "string"}


def _fewest(schema, vocab) -> tuple[Fewest, object]:
    table = compile_constraint(Constraint.json_schema(schema), vocab)
    return budget.fewest_tokens(table, schema, vocab), table


def _tokens(text: str, vocab) -> int:
    """Fewest tokens that spell `text` exactly (a DP over the vocabulary's token bytes)."""
    data = text.encode()
    by_len: dict[int, set[bytes]] = {}
    for b in vocab.token_bytes:
        if b:
            by_len.setdefault(len(b), set()).add(b)
    best = [0] + [len(data) + 1] * len(data)
    for end in range(1, len(data) + 1):
        for n, spelled in by_len.items():
            if n <= end and data[end - n : end] in spelled:
                best[end] = min(best[end], best[end - n] + 1)
    return best[len(data)]


def test_forced_says_proven_shown_or_unknown():
    exact = Fewest(lower=7, upper=7)
    assert exact.forced(6) is True and exact.forced(7) is False
    gap = Fewest(lower=5, upper=8)
    assert gap.forced(4) is True and gap.forced(5) is None and gap.forced(8) is False
    assert Fewest(lower=None, upper=None).forced(1000) is True  # no non-degenerate output


def test_an_array_of_strings_is_not_forced_once_one_item_fits(embedded_vocab):
    # `[]` is degenerate; `[""]` (an item, the array beyond its minimum) is not.
    fewest, table = _fewest({"type": "array", "items": STR}, embedded_vocab)
    assert table.min_tokens == 1 or table.shortest_output == "[]"
    assert fewest.lower == fewest.upper == _tokens(fewest.witness, embedded_vocab)
    assert fewest.witness.startswith("[") and fewest.witness != "[]"
    assert fewest.forced(fewest.lower - 1) is True
    assert fewest.forced(fewest.lower) is False


def test_only_degenerate_outputs_are_forced_at_every_budget(embedded_vocab):
    # Every output is `{"tags": []}` or `{}`-like hollow: the enum allows only empty arrays.
    schema = {
        "type": "object",
        "properties": {"tags": {"enum": [[]]}},
        "required": ["tags"],
        "additionalProperties": False,
    }
    fewest, _ = _fewest(schema, embedded_vocab)
    assert fewest.upper is None
    assert fewest.forced(10_000) is True


def test_no_slot_means_never_forced(embedded_vocab):
    fewest, table = _fewest({"type": "integer"}, embedded_vocab)
    assert fewest.forced(table.min_tokens) is False


def test_a_long_required_value_forces_small_budgets(embedded_vocab):
    # An optional property whose only non-empty value is a long constant: `{}` costs 1
    # token, anything non-degenerate costs the constant's tokens too.
    word = "supercalifragilisticexpialidocious-antidisestablishmentarianism"
    schema = {
        "type": "object",
        "properties": {"x": {"enum": ["", word]}},
        "additionalProperties": False,
    }
    fewest, table = _fewest(schema, embedded_vocab)
    assert table.shortest_output == "{}"
    assert fewest.lower == fewest.upper
    assert word in fewest.witness
    assert fewest.lower >= _tokens(word, embedded_vocab) + 2
    assert fewest.forced(fewest.lower - 1) is True
    assert fewest.forced(fewest.lower) is False


def test_min_length_is_read_from_the_schema_the_metric_uses(embedded_vocab):
    # minLength 3: "abc" is still hollow, a non-degenerate name needs 4 characters.
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 3}},
        "required": ["name"],
        "additionalProperties": False,
    }
    fewest, _ = _fewest(schema, embedded_vocab)
    assert fewest.lower == fewest.upper
    name = fewest.witness.split('"name":')[1].strip().strip("}").strip()
    assert len(name) - 2 >= 4


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        ({"type": "array", "items": STR}, {"/", "/(slot-free)"}),
        (
            {
                "type": "object",
                "properties": {"a": STR, "b": {"type": "integer"}},
                "required": ["b"],
            },
            {"/", "/a", "/(slot-free)"},
        ),
    ],
)
def test_variants_cover_each_place(schema, where):
    node, _ = normalize_schema(schema)
    found = {w for w, _, _ in slot_variants(node, schema)}
    assert found == where


def test_slot_free_variant_drops_strings_arrays_and_objects_with_optional_keys():
    schema = {
        "anyOf": [
            {"type": "integer"},
            STR,
            {"type": "object", "properties": {"a": {"type": "integer"}}},
        ]
    }
    node, _ = normalize_schema(schema)
    (free,) = [v for w, v, _ in slot_variants(node, schema) if w == "/(slot-free)"]
    assert free == {"type": "integer"}


def test_place_follows_the_metric():
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/s"}, "b": STR},
        "required": ["b"],
        "$defs": {"s": {"type": "string", "minLength": 2}},
    }
    top = Place(schema, [schema])
    assert top.optional() == {"a"}
    assert top.child("a").min_length() == 2


def test_fewest_non_degenerate_reads_the_metric_through_its_callback(embedded_vocab):
    # A metric that calls everything degenerate: nothing is ever shown to fit.
    schema = {"type": "array", "items": STR}
    table = compile_constraint(Constraint.json_schema(schema), embedded_vocab)
    fewest = fewest_non_degenerate(schema, table, embedded_vocab, lambda text: True)
    assert fewest.upper is None and fewest.lower is not None
    assert fewest.forced(fewest.lower) is None  # a bound, not a proof either way
