"""What bench/budget/run.py measures on each output, and how it aggregates them. Pure functions.

Per output (the text a sequence generated, with its schema):

- strict parse: `json.loads(text)` succeeds on the whole text (surrounding whitespace is
  allowed, as json.loads allows it).
- extracted parse: the first JSON value found in the text. Candidate start positions are,
  in order, the first non-whitespace character and then every `{` or `[`; the first one at
  which `json.JSONDecoder().raw_decode` succeeds gives the value (anything after it is
  ignored). This is how a client would salvage JSON wrapped in prose or a code fence.
- valid: the strictly parsed value validates against the schema (jsonschema
  Draft202012Validator with its FORMAT_CHECKER). "valid (extracted)" validates the
  extracted value instead.
- slot: a string, an array, or an object whose schema has optional properties (listed in
  `properties` but not in `required`), anywhere in the output value.
- hollow slot: a slot at its minimum size: a string of length <= its minLength (default 0,
  i.e. ""), an array of length <= its minItems (default 0), an object whose optional
  properties are absent or empty ("", [], {} or null). minLength, minItems and required
  are gathered from the schema
  nodes that apply at the value's place, found by following properties,
  patternProperties, additionalProperties, items, prefixItems, local `$ref`s, allOf, anyOf
  and oneOf (the largest minimum, the union of required).
- degenerate: the output is valid (extracted, so strict-valid outputs included), has at
  least one slot, and every slot is hollow: the output is the schema's skeleton, closed in
  the shortest way everywhere (`{}` or `{"url": ""}` for an object of optional
  properties, `{"name": "", "age": 0}` for a person).
- useful: valid (extracted) and not degenerate.
- hollow share: among valid (extracted) outputs with at least one slot, the mean fraction
  of their slots that are hollow (it shows partial closure that `degenerate` misses).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

MISSING: Any = object()  # no JSON value was found
_EMPTY: list[Any] = ["", [], {}, None]


def parse_strict(text: str) -> Any:
    """The whole text as one JSON value, or MISSING."""
    try:
        return json.loads(text)
    except ValueError:
        return MISSING


def extract_json(text: str) -> Any:
    """The first JSON value in `text` (see the module docstring), or MISSING."""
    decoder = json.JSONDecoder()
    stripped = len(text) - len(text.lstrip())
    starts = [stripped] + [i for i, ch in enumerate(text) if ch in "{[" and i != stripped]
    for start in starts:
        if start >= len(text):
            continue
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        return value
    return MISSING


def _resolve(ref: str, root: Any) -> Any:
    """A local `$ref` ("#/definitions/x"), or None when it is not local or does not resolve."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in unquote(ref[1:]).split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _expand(node: Any, root: Any, seen: frozenset[int] = frozenset()) -> Iterator[dict]:
    """`node` and every schema it pulls in at the same place ($ref, allOf, anyOf, oneOf)."""
    if not isinstance(node, dict) or id(node) in seen:
        return
    seen = seen | {id(node)}
    yield node
    if isinstance(node.get("$ref"), str):
        yield from _expand(_resolve(node["$ref"], root), root, seen)
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in _list(node.get(key)):
            yield from _expand(sub, root, seen)


def _children(nodes: list[dict], key: str | int) -> list[Any]:
    """Schema nodes that apply to the member `key` of an object (str) or array (int)."""
    out: list[Any] = []
    for n in nodes:
        if isinstance(key, str):
            props = _dict(n.get("properties"))
            matched = key in props
            if matched:
                out.append(props[key])
            for pattern, sub in _dict(n.get("patternProperties")).items():
                try:
                    if re.search(pattern, key):
                        out.append(sub)
                        matched = True
                except re.error:
                    pass
            if not matched and isinstance(n.get("additionalProperties"), dict):
                out.append(n["additionalProperties"])
        else:
            prefix = n.get("prefixItems")
            items = n.get("items")
            if isinstance(prefix, list) and key < len(prefix):
                out.append(prefix[key])
            elif isinstance(items, list):  # draft-04 tuple form
                if key < len(items):
                    out.append(items[key])
                elif isinstance(n.get("additionalItems"), dict):
                    out.append(n["additionalItems"])
            elif isinstance(items, dict):
                out.append(items)
    return out


def hollow_slots(value: Any, schema: Any) -> list[bool]:
    """One flag per slot of `value`, depth first: whether it is at its minimum size."""
    flags: list[bool] = []

    def walk(v: Any, nodes: list[Any]) -> None:
        expanded = [x for n in nodes for x in _expand(n, schema)]
        if isinstance(v, str):
            least = max((_int(n.get("minLength")) for n in expanded), default=0)
            flags.append(len(v) <= least)
        elif isinstance(v, list):
            least = max((_int(n.get("minItems")) for n in expanded), default=0)
            flags.append(len(v) <= least)
            for i, item in enumerate(v):
                walk(item, _children(expanded, i))
        elif isinstance(v, dict):
            required = {k for n in expanded for k in _list(n.get("required"))}
            optional = {k for n in expanded for k in _dict(n.get("properties"))} - required
            if optional:
                flags.append(all(v[k] in _EMPTY for k in set(v) & optional))
            for k, item in v.items():
                walk(item, _children(expanded, k))

    walk(value, [schema])
    return flags


def _list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


@dataclass(frozen=True)
class Score:
    """The measures of one output (see the module docstring)."""

    strict_parse: bool
    extracted_parse: bool
    valid: bool
    valid_extracted: bool
    degenerate: bool
    hollow_share: float | None  # None: not valid, or no slot in it
    validator_error: str = ""  # the validator could not check this output (counted invalid)


def score(text: str, schema: Any, validator: Any) -> Score:
    """Measure one output against its schema; `validator` is a jsonschema validator for it."""
    strict = parse_strict(text)
    extracted = strict if strict is not MISSING else extract_json(text)
    errors: list[str] = []
    valid = strict is not MISSING and _check(validator, strict, errors)
    valid_extracted = extracted is not MISSING and (valid or _check(validator, extracted, errors))
    flags = hollow_slots(extracted, schema) if valid_extracted else []
    return Score(
        strict_parse=strict is not MISSING,
        extracted_parse=extracted is not MISSING,
        valid=valid,
        valid_extracted=valid_extracted,
        degenerate=valid_extracted and bool(flags) and all(flags),
        hollow_share=sum(flags) / len(flags) if flags else None,
        validator_error=errors[0] if errors else "",
    )


def _check(validator: Any, value: Any, errors: list[str]) -> bool:
    """validator.is_valid(value); False, with the reason in `errors`, when the validator
    itself fails (an unresolvable $ref, a draft-04 keyword it cannot read)."""
    try:
        return bool(validator.is_valid(value))
    except Exception as e:  # noqa: BLE001 - jsonschema raises many types here
        errors.append(f"{type(e).__name__}: {e}"[:300])
        return False


def validator_for(schema: Any) -> Any:
    """A Draft 2020-12 validator that also checks `format`."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def aggregate(records: Iterable[dict[str, Any]], arms: list[str], levels: list[str]) -> list[dict]:
    """One row per (arm, level) with records, in the given orders.

    Each record needs: arm, level, tokens, finish_reason and the fields of a Score, and may
    have `forced` (True: proven that no non-degenerate output fits the cell's budget; False:
    one fits; None: unknown, counted as not forced; see bench/budget/forced.py). A row has
    n, schemas, parse/valid/degenerate/useful percentages, forced % and degenerate % among
    the cells not forced, the count of cells whose forcedness is unknown, hollow share %,
    mean tokens and finish reasons as percentages.
    """
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["arm"], r["level"]), []).append(r)
    rows = []
    for arm in arms:
        for level in levels:
            group = groups.get((arm, level))
            if not group:
                continue
            n = len(group)
            count = Counter[str]()
            for r in group:
                count.update(
                    k
                    for k in ("strict_parse", "extracted_parse", "valid", "valid_extracted")
                    if r[k]
                )
                count["degenerate"] += bool(r["degenerate"])
                forced = r.get("forced") is True
                count["forced"] += forced
                count["unknown"] += "forced" in r and r["forced"] is None
                count["free_degenerate"] += bool(r["degenerate"] and not forced)
                count["useful"] += bool(r["valid_extracted"] and not r["degenerate"])
            shares = [r["hollow_share"] for r in group if r["hollow_share"] is not None]
            same = {
                k: [r[k] for r in group if r.get(k) is not None]
                for k in ("same_as_forward_only", "same_as_budget_aware")
            }
            reasons = Counter(r["finish_reason"] for r in group)
            rows.append(
                {
                    "arm": arm,
                    "level": level,
                    "n": n,
                    "schemas": len({r["schema"] for r in group}),
                    "parse_strict_pct": _pct(count["strict_parse"], n),
                    "parse_extracted_pct": _pct(count["extracted_parse"], n),
                    "valid_pct": _pct(count["valid"], n),
                    "valid_extracted_pct": _pct(count["valid_extracted"], n),
                    "degenerate_pct": _pct(count["degenerate"], n),
                    "forced_pct": _pct(count["forced"], n),
                    "forced": count["forced"],
                    "forced_unknown": count["unknown"],
                    "free_degenerate_pct": _pct(count["free_degenerate"], n - count["forced"]),
                    "useful_pct": _pct(count["useful"], n),
                    "hollow_share_pct": round(100 * sum(shares) / len(shares), 1)
                    if shares
                    else None,
                    "mean_tokens": round(sum(r["tokens"] for r in group) / n, 1),
                    **{f"{k}_pct": _pct(sum(v), len(v)) if v else None for k, v in same.items()},
                    "finish": {k: _pct(v, n) for k, v in sorted(reasons.items())},
                }
            )
    return rows


def mark_same_outputs(records: list[dict[str, Any]]) -> None:
    """Set `same_as_forward_only` and `same_as_budget_aware` on every greedy record.

    same_as_forward_only: the text equals the forward-only arm's for the same (schema,
    budget), counted only where that arm completed (finish "stop", valid); else None.
    same_as_budget_aware: the text equals the budget-aware arm's. Sampled records get None:
    only greedy decoding is deterministic enough to compare outputs.
    """
    greedy = {(r["arm"], r["schema"], r["budget"]): r for r in records if r["temperature"] == 0.0}
    for r in records:
        r["same_as_forward_only"] = r["same_as_budget_aware"] = None
        if r["temperature"] != 0.0:
            continue
        fo = greedy.get(("forward-only", r["schema"], r["budget"]))
        if r["arm"] != "forward-only" and fo and fo["finish_reason"] == "stop" and fo["valid"]:
            r["same_as_forward_only"] = r["text"] == fo["text"]
        ba = greedy.get(("budget-aware", r["schema"], r["budget"]))
        if r["arm"] != "budget-aware" and ba is not None:
            r["same_as_budget_aware"] = r["text"] == ba["text"]
