"""JSON values as JSON Schema (and so the OpenAPI document) sees them.

JSON has one number type: `5.0` is the integer 5 to JSON Schema's `"type": "integer"` and to
its `enum`, yet `true` is no number and `"5"` no integer. Request fields read integers with
`JsonInt` so the server accepts exactly what its document calls an integer.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema's `enum` sees it: 1 == 1.0, yet false != 0 and true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return a == b


def integral(value: Any) -> Any:
    """`value` as an int when it is a float with no fractional part (5.0), else unchanged
    (a strict int field then refuses 5.5, "5" and true with pydantic's own message)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# A strict integer that also takes an integral JSON number (fields add strict=True). The
# validator wraps the whole `int | None`, so that the field's bounds still reach the
# document as `minimum`/`maximum`.
JsonInt = Annotated[int, BeforeValidator(integral)]
OptionalJsonInt = Annotated[int | None, BeforeValidator(integral)]
