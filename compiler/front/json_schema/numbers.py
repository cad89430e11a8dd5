"""Regexes for bounded JSON numbers: `minimum`, `maximum`, the exclusive bounds, `multipleOf`.

outlines-core 0.2.14 ignores all five, so `{"type": "integer", "minimum": 0}` could emit
`-5`. These regexes enumerate decimal digit strings instead: an integer range becomes
per-length digit ranges (`[1-9][0-9]` for 10..99), a decimal bound compares the integer
part and then the fraction digit by digit. Bounded numbers never use exponent notation:
every value in range still has a plain decimal spelling, so nothing valid is lost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gclm.errors import ConstraintError, UnsupportedSchemaError, quote

_ENUMERATE_LIMIT = 1000  # a bounded multipleOf with at most this many values is listed
# An integer multipleOf dividing 10**d, d up to this, is written by its last d digits (at
# most 625 tails: 16 divides 10**4).
_TAIL_DIGITS = 4


def number_regex(node: dict[str, Any], pointer: str) -> str | None:
    """Regex for a normalised integer or number node with bounds or `multipleOf`.

    Bounds are `minimum`/`maximum` plus 2020-12 numeric `exclusiveMinimum`/
    `exclusiveMaximum`. Returns None when the node has none of them (outlines-core's own
    regex is then exact). A `multipleOf` the digit rules below do not express is listed
    where both bounds leave at most `_ENUMERATE_LIMIT` multiples (`multipleOf: 0.5` between
    0 and 5: 0, 0.5, ..., 5).

    Raises:
        ConstraintError: the bounds admit no value (`minimum` above `maximum`, or no integer
            between them).
        UnsupportedSchemaError: a `multipleOf` that no regex here expresses (one that is
            neither a power-of-ten fraction nor an integer dividing 1000, nor bounded to a
            short list), or fractional bounds this module does not combine.
    """
    try:
        return _digit_rules(node, pointer)
    except UnsupportedSchemaError:
        listed = _listed_multiples(node)
        if listed is None:
            raise
        return listed


def _digit_rules(node: dict[str, Any], pointer: str) -> str | None:
    lo, lo_excl = _bound(node, "minimum", "exclusiveMinimum", max)
    hi, hi_excl = _bound(node, "maximum", "exclusiveMaximum", min)
    step = node.get("multipleOf")
    if lo is None and hi is None and step is None:
        return None
    integer = node["type"] == "integer"
    frac_digits: int | None = None
    if step is not None:
        step_d = Decimal(str(step))
        if step_d == step_d.to_integral_value():
            integer, step = True, int(step_d)
        elif step_d == Decimal(1).scaleb(step_d.adjusted()) and not integer:
            frac_digits, step = -step_d.adjusted(), None
        else:
            raise UnsupportedSchemaError(
                "multipleOf", pointer, f"multipleOf {step} is not supported"
            )
    if integer:
        ilo = None if lo is None else (math.floor(lo) + 1 if lo_excl else math.ceil(lo))
        ihi = None if hi is None else (math.ceil(hi) - 1 if hi_excl else math.floor(hi))
        if ilo is not None and ihi is not None and ilo > ihi:
            _empty_range(node, pointer, "integer")
        return _integer_regex(ilo, ihi, step if step and step > 1 else None, pointer)
    if lo is not None and hi is not None and (lo > hi or lo == hi and (lo_excl or hi_excl)):
        _empty_range(node, pointer, "number")
    return _decimal_regex(lo, lo_excl, hi, hi_excl, frac_digits, pointer)


def _listed_multiples(node: dict[str, Any]) -> str | None:
    """The node's multiples of `multipleOf` between its bounds, each in its one plain
    spelling (no exponent, no trailing fraction zeros), when there are at most
    `_ENUMERATE_LIMIT` of them and at least one; None otherwise (no step, unbounded, too
    many, or none). An integer's multiples are the integers among them."""
    lo, lo_excl = _bound(node, "minimum", "exclusiveMinimum", max)
    hi, hi_excl = _bound(node, "maximum", "exclusiveMaximum", min)
    if "multipleOf" not in node or lo is None or hi is None:
        return None
    step, integer = Decimal(str(node["multipleOf"])), node["type"] == "integer"
    if (hi - lo) / step > _ENUMERATE_LIMIT:
        return None
    values = []
    k = (lo / step).to_integral_value(rounding=ROUND_CEILING)
    while (v := k * step) <= hi:
        inside = (v > lo or not lo_excl) and (v < hi or not hi_excl)
        if inside and (not integer or v == v.to_integral_value()):
            values.append(_plain(v).replace(".", r"\."))
        k += 1
    return _alt(values) if values else None


def _plain(value: Decimal) -> str:
    """`value` as JSON writes a decimal plainly: 2.5, 10, -0.25 (never -0 nor 1E+1)."""
    return "0" if value == 0 else format(value.normalize(), "f")


def _empty_range(node: dict[str, Any], pointer: str, kind: str) -> None:
    bounds = ", ".join(
        f"{k} {quote(node[k], 40)}"
        for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
        if k in node
    )
    raise ConstraintError(
        f"No {kind} satisfies the bounds at {pointer or '/'} ({bounds}): the lower bound is "
        "above the upper one. Fix the bounds.",
        param=None,
    )


def _bound(
    node: dict[str, Any], inclusive: str, exclusive: str, pick: Any
) -> tuple[Decimal | None, bool]:
    """The tighter of an inclusive and an exclusive bound, as (value, is_exclusive)."""
    candidates = []
    if inclusive in node:
        candidates.append((Decimal(str(node[inclusive])), False))
    if exclusive in node:
        candidates.append((Decimal(str(node[exclusive])), True))
    if not candidates:
        return None, False
    best = pick(c[0] for c in candidates)
    return best, any(c == (best, True) for c in candidates)


def _alt(alternatives: Sequence[str | None]) -> str:
    parts = [p for p in alternatives if p is not None]
    if not parts:
        return r"[^\x00-\U0010FFFF]"  # empty range: matches nothing
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


# ----------------------------------------------------------------------------- integers


def _digits_range(lo: str, hi: str) -> str:
    """Regex for digit strings of one length between `lo` and `hi`, leading zeros kept."""
    if not lo:
        return ""
    if lo[0] == hi[0]:
        return lo[0] + _digits_range(lo[1:], hi[1:])
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return f"[{lo[0]}-{hi[0]}]" + (f"[0-9]{{{n}}}" if n else "")
    parts = [lo[0] + _digits_range(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + (f"[0-9]{{{n}}}" if n else ""))
    parts.append(hi[0] + _digits_range("0" * n, hi[1:]))
    return _alt(parts)


def nonneg_int_range(lo: int, hi: int | None) -> str | None:
    """Regex for canonical decimals of the integers in [lo, hi] (lo >= 0; hi None: no bound)."""
    if hi is not None and hi < lo:
        return None
    parts = []
    top = hi if hi is not None else 10 ** len(str(lo)) - 1
    for length in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(top, 10**length - 1)
        parts.append(_digits_range(str(a), str(b)))
    if hi is None:
        parts.append(f"[1-9][0-9]{{{len(str(lo))},}}")
    return _alt(parts)


def _integer_regex(lo: int | None, hi: int | None, step: int | None, pointer: str) -> str:
    if lo is not None and hi is not None and lo > hi:
        return _alt([])
    if step is not None:
        return _multiples_regex(lo, hi, step, pointer)
    negative = None
    if lo is None or lo < 0:
        # -1 down to lo: the magnitudes run from max(1, -hi) up to -lo.
        top = None if lo is None else -lo
        bottom = 1 if hi is None or hi >= 0 else -hi
        inner = nonneg_int_range(bottom, top)
        negative = None if inner is None else "-" + inner
    nonneg = None if hi is not None and hi < 0 else nonneg_int_range(max(lo or 0, 0), hi)
    return _alt([negative, nonneg])


def _multiples_regex(lo: int | None, hi: int | None, step: int, pointer: str) -> str:
    if lo is not None and hi is not None and (hi - lo) // step <= _ENUMERATE_LIMIT:
        first = -(-lo // step) * step
        return _alt([str(v) for v in range(first, hi + 1, step)])
    digits = next((d for d in range(1, _TAIL_DIGITS + 1) if 10**d % step == 0), None)
    if digits is not None:
        negative = None
        if lo is None or lo < 0:  # magnitudes from max(1, -hi) up to -lo
            bottom = 1 if hi is None or hi >= 0 else -hi
            inner = _tail_multiples(bottom, None if lo is None else -lo, step, digits)
            negative = None if inner is None else "-" + inner
        nonneg = None if hi is not None and hi < 0 else max(lo or 0, 0)
        positive = None if nonneg is None else _tail_multiples(nonneg, hi, step, digits)
        return _alt([negative, positive])
    raise UnsupportedSchemaError(
        "multipleOf", pointer, f"multipleOf {step} with these bounds is not supported"
    )


def _tail_multiples(lo: int, hi: int | None, step: int, digits: int) -> str | None:
    """Regex for canonical decimals of the multiples of `step` (a divisor of 10**digits) in
    [lo, hi] (lo >= 0; hi None: no bound); None when there are none. Divisibility by a
    divisor of 10**digits depends on the last `digits` digits only: a longer number is a
    prefix (compared with the bounds' own) and a tail from the multiples below 10**digits,
    and the numbers below 10**digits are listed."""
    if hi is not None and hi < lo:
        return None
    base = 10**digits

    def tails(a: int, b: int) -> str | None:
        listed = [f"{v:0{digits}d}" for v in range(-(-a // step) * step, b + 1, step)]
        return _alt(listed) if listed else None

    parts: list[str | None] = []
    below = base - 1 if hi is None else min(hi, base - 1)
    parts += [str(v) for v in range(-(-lo // step) * step, below + 1, step)]
    if hi is not None and hi < base:
        return _alt(parts) if parts else None
    first, first_tail = divmod(max(lo, base), base)
    last, last_tail = (None, base - 1) if hi is None else divmod(hi, base)
    if first == last:
        tail = tails(first_tail, last_tail)
        parts.append(None if tail is None else f"{first}{tail}")
    else:
        tail = tails(first_tail, base - 1)
        parts.append(None if tail is None else f"{first}{tail}")
        middle = nonneg_int_range(first + 1, None if last is None else last - 1)
        parts.append(None if middle is None else middle + _alt([tails(0, base - 1)]))
        if last is not None:
            tail = tails(0, last_tail)
            parts.append(None if tail is None else f"{last}{tail}")
    return _alt(parts) if any(p is not None for p in parts) else None


# ----------------------------------------------------------------------------- decimals


def _split(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a non-negative decimal."""
    whole = int(value)
    frac = format(value - whole, "f").partition(".")[2].rstrip("0")
    return whole, frac


def _fraction_at_least(f: str, strict: bool) -> str:
    """Digit strings D (non-empty) with 0.D >= 0.f, or > 0.f when strict."""
    parts = [f[:i] + f"[{int(d) + 1}-9][0-9]*" for i, d in enumerate(f) if d != "9"]
    parts.append(f + ("[0-9]*[1-9][0-9]*" if strict else "[0-9]*"))
    return _alt(parts)


def _fraction_at_most(f: str, strict: bool) -> str:
    """Digit strings D (non-empty) with 0.D <= 0.f, or < 0.f when strict (f has no trailing 0)."""
    parts = [f[:i] + f"[0-{int(d) - 1}][0-9]*" for i, d in enumerate(f) if d != "0"]
    parts += [f[:i] for i in range(1, len(f))]
    if not strict:
        parts.append(f + "0*")
    return _alt(parts)


def _nonneg_decimal(
    lo: Decimal,
    lo_excl: bool,
    hi: Decimal | None,
    hi_excl: bool,
    frac_digits: int | None,
    pointer: str,
) -> str | None:
    """Regex for plain decimals x >= 0 with lo <= x <= hi (each bound possibly exclusive)."""
    if (
        frac_digits == 0
        or frac_digits is not None
        and (_split(lo)[1] or hi is not None and _split(hi)[1])
    ):
        raise UnsupportedSchemaError(
            "multipleOf", pointer, "a fractional multipleOf with fractional bounds"
        )
    any_frac = r"(?:\.[0-9]+)?" if frac_digits is None else rf"(?:\.[0-9]{{1,{frac_digits}}})?"
    nonzero_frac = (
        r"\.[0-9]*[1-9]" if frac_digits is None else rf"\.[0-9]{{0,{frac_digits - 1}}}[1-9]"
    )
    i0, f0 = _split(lo)
    i1, f1 = (None, "") if hi is None else _split(hi)
    if hi is not None and (hi < lo or hi == lo and (lo_excl or hi_excl)):
        return None
    if i1 == i0:
        if f1 and not f0 and not lo_excl:
            return f"{i0}" + r"(?:\." + _fraction_at_most(f1, hi_excl) + ")?"
        if f0 or f1:
            raise UnsupportedSchemaError(
                "minimum", pointer, "both bounds inside the same unit interval"
            )
        return str(i0)  # lo == hi, both inclusive
    parts = []
    if f0:
        parts.append(rf"{i0}\." + _fraction_at_least(f0, lo_excl))
    else:
        parts.append(f"{i0}" + (nonzero_frac if lo_excl else any_frac))
    middle = nonneg_int_range(i0 + 1, None if i1 is None else i1 - 1)
    if middle is not None:
        parts.append(middle + any_frac)
    if i1 is not None:
        if f1:
            parts.append(f"{i1}" + r"(?:\." + _fraction_at_most(f1, hi_excl) + ")?")
        elif not hi_excl:
            parts.append(f"{i1}")
    return _alt(parts)


def _decimal_regex(
    lo: Decimal | None,
    lo_excl: bool,
    hi: Decimal | None,
    hi_excl: bool,
    frac_digits: int | None,
    pointer: str,
) -> str:
    if lo is not None and hi is not None and (lo > hi or lo == hi and (lo_excl or hi_excl)):
        return _alt([])
    negative = None
    if lo is None or lo < 0:
        # x in [lo, min(hi, 0)) is -y with y in (max(-hi, 0), -lo]; -0 is never written.
        y_lo, y_lo_excl = (Decimal(0), True) if hi is None or hi >= 0 else (-hi, hi_excl)
        if lo is None:
            inner = _nonneg_decimal(y_lo, y_lo_excl, None, False, frac_digits, pointer)
        else:
            inner = _nonneg_decimal(y_lo, y_lo_excl, -lo, lo_excl, frac_digits, pointer)
        negative = None if inner is None else "-" + inner
    nonneg = None
    if hi is None or hi > 0 or hi == 0 and not hi_excl:
        start, start_excl = (lo, lo_excl) if lo is not None and lo >= 0 else (Decimal(0), False)
        nonneg = _nonneg_decimal(start, start_excl, hi, hi_excl, frac_digits, pointer)
    return _alt([negative, nonneg])
