"""Free-form objects (`"type": "object"`, nothing declared): values nest 2 deep, within a budget."""

from __future__ import annotations

from json_accepts import accepts

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import FREE_DEPTH_BUDGET, to_regex

# MaskBench Github_medium---o8461: the whole schema; its valid instance holds an array
# of objects, `{"hardware_inventory_inventory_info": [{"module": "chassis", ...}]}`.
INVENTORY = {"type": "object", "minProperties": 1}


def test_root_free_form_object_holds_arrays_of_objects():
    value = {"info": [{"module": "chassis", "serial": "VF37"}, {"module": "FPC 0"}]}
    assert accepts(INVENTORY, value)
    assert accepts({"type": "object"}, {"a": [[1, 2], [3, 4]], "b": {"c": {"d": None}}})


def test_root_free_form_object_keeps_its_other_keywords_and_a_depth_bound():
    assert not accepts(INVENTORY, {})  # minProperties 1
    assert not accepts(INVENTORY, {"a": [[[1]]]})  # 4 levels: past json_object's 3


def test_a_free_form_object_inside_a_schema_holds_arrays_of_objects():
    # MaskBench Github_easy---o25106: a free-form configuration holding a list of steps.
    schema = {"type": "object", "properties": {"meta": {"type": "object"}}, "required": ["meta"]}
    assert accepts(schema, {"meta": {"steps": [{"b": 1}, {"c": "x"}]}})
    assert not accepts(schema, {"meta": {"steps": [{"c": [1]}]}})  # 3 levels under meta


def test_an_unconstrained_value_stays_one_level_deep():
    schema = {"type": "object", "properties": {"any": {}}, "required": ["any"]}
    assert accepts(schema, {"any": [1, 2]})
    assert not accepts(schema, {"any": [{"b": 1}]})


def test_many_free_form_objects_fall_back_to_one_level_within_the_budget():
    props = {f"p{i}": {"type": "object"} for i in range(80)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    result = to_regex(Constraint.json_schema(schema))
    assert len(result.regex) <= FREE_DEPTH_BUDGET + 10
    assert not any("free-form object" in r for r in result.rewrites)
    one = {"type": "object", "properties": {"p": {"type": "object"}}}
    assert any("free-form object" in r for r in to_regex(Constraint.json_schema(one)).rewrites)


def test_a_long_regex_without_free_form_objects_is_built_once(monkeypatch):
    # Past the budget, the schema is normalised again with free-form objects one level
    # deep; with none in it, that would build the same regex a second time.
    import gclm.compiler.front.regex as regex_module

    built = []
    build = regex_module.schema_regex
    monkeypatch.setattr(
        regex_module, "schema_regex", lambda *a, **k: built.append(1) or build(*a, **k)
    )
    words = [f"{i:08d}" * 10 for i in range(FREE_DEPTH_BUDGET // 80 + 100)]
    schema = {"type": "object", "properties": {"w": {"enum": words}}, "required": ["w"]}
    long = to_regex(Constraint.json_schema(schema)).regex
    assert len(long) > FREE_DEPTH_BUDGET and len(built) == 1
    # With a free-form object in it, the fallback still builds it shallower.
    schema["properties"]["meta"] = {"type": "object"}
    result = to_regex(Constraint.json_schema(schema))
    assert len(built) == 3
    assert not any("free-form object" in r for r in result.rewrites)
