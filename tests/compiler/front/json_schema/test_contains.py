"""contains: arrays whose every item matches it (at least minContains items)."""

from __future__ import annotations

import pytest
from json_accepts import accepts

from gclm.compiler.front.json_schema.normalize import normalize_schema
from gclm.errors import UnsupportedSchemaError

# The shape of MaskBench JsonSchemaStore---utam-page-object's profiles (refused before).
PROFILE = {"type": "array", "contains": {"type": "string"}}


def test_arrays_of_matching_items_are_generated():
    assert accepts(PROFILE, ["web"]) and accepts(PROFILE, ["web", "ios"])
    assert not accepts(PROFILE, [])  # contains needs one item
    assert not accepts(PROFILE, [1])
    assert not accepts(PROFILE, ["web", 1])  # valid, but not generated (reported)
    _, rewrites = normalize_schema(PROFILE)
    assert "/: contains: every item generated matches it" in rewrites


def test_min_contains_and_items_are_kept():
    schema = {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 5}}
    schema["minContains"] = 2
    assert accepts(schema, [5, 7]) and not accepts(schema, [5]) and not accepts(schema, [5, 4])


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "contains": {"type": "string"}, "maxContains": 1},
        {"type": "array", "prefixItems": [{"type": "integer"}], "contains": {"type": "string"}},
        {"type": "array", "items": [{"type": "integer"}], "contains": {"type": "string"}},
    ],
)
def test_contains_that_every_item_cannot_meet_is_refused(schema):
    with pytest.raises(UnsupportedSchemaError) as e:
        normalize_schema(schema)
    assert e.value.keyword == "contains"
