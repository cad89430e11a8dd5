"""uniqueItems: arrays of at most one item (always distinct); refused when more are required."""

from __future__ import annotations

import pytest
from json_accepts import accepts

from gclm.compiler.front.json_schema.normalize import normalize_schema
from gclm.errors import UnsupportedSchemaError

# MaskBench JsonSchemaStore---csscomb: files to exclude, once refused.
EXCLUDE = {
    "type": "object",
    "properties": {
        "exclude": {
            "type": "array",
            "uniqueItems": True,
            "items": {"type": "string", "minLength": 1},
        }
    },
}


def test_unique_arrays_are_generated_with_at_most_one_item():
    assert accepts(EXCLUDE, {"exclude": []})
    assert accepts(EXCLUDE, {"exclude": ["node_modules/**"]})
    assert not accepts(EXCLUDE, {"exclude": ["a", "a"]})  # a duplicate: never generated
    assert not accepts(EXCLUDE, {"exclude": ["a", "b"]})  # valid, but not generated


def test_the_narrowing_is_reported():
    _, rewrites = normalize_schema(EXCLUDE)
    assert "/properties/exclude: uniqueItems: arrays generated with at most 1 item" in rewrites


def test_unique_items_with_more_than_one_required_item_is_refused():
    with pytest.raises(UnsupportedSchemaError) as e:
        normalize_schema({"type": "array", "uniqueItems": True, "minItems": 2})
    assert e.value.keyword == "uniqueItems"
