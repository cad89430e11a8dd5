"""A free-form object that is the whole output: its values nest as json_object's do."""

from __future__ import annotations

import json
import re

from gclm.compiler.constraint import Constraint
from gclm.compiler.regex import to_regex

# MaskBench Github_medium---o8461: the whole schema; its valid instance holds an array
# of objects, `{"hardware_inventory_inventory_info": [{"module": "chassis", ...}]}`.
INVENTORY = {"type": "object", "minProperties": 1}


def accepts(schema, value) -> bool:
    regex = to_regex(Constraint.json_schema(schema)).regex
    return re.fullmatch(regex, json.dumps(value, separators=(",", ":"))) is not None


def test_root_free_form_object_holds_arrays_of_objects():
    value = {"info": [{"module": "chassis", "serial": "VF37"}, {"module": "FPC 0"}]}
    assert accepts(INVENTORY, value)
    assert accepts({"type": "object"}, {"a": [[1, 2], [3, 4]], "b": {"c": {"d": None}}})


def test_root_free_form_object_keeps_its_other_keywords_and_a_depth_bound():
    assert not accepts(INVENTORY, {})  # minProperties 1
    assert not accepts(INVENTORY, {"a": [[[1]]]})  # 4 levels: past json_object's 3


def test_a_free_form_object_inside_a_schema_stays_one_level_deep():
    schema = {"type": "object", "properties": {"meta": {"type": "object"}}, "required": ["meta"]}
    assert accepts(schema, {"meta": {"a": [1, 2]}})
    assert not accepts(schema, {"meta": {"a": [{"b": 1}]}})
