"""A recursive `$ref` kept as a call, for the pushdown masks (compiler/grown/pushdown.py).

In a normalisation that keeps calls (`Normalizer.calls`), a `$ref` to a definition already
being expanded becomes a FrameCall: a node that stands for the whole definition, written as
one placeholder character in the regex (`call_char`) and made a call edge of the NFA. Only
passing it along is allowed: every rewrite that would read it (a meet with sibling keywords,
a proof over its values) raises OpaqueCall, and the schema is then unrolled as before.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

# The private-use characters of plane 15 (U+F0000 + f) stand for calls to frame f in a
# regex: a schema that holds one (or an escape that could write one) keeps no call
# (compiler/front/json_schema/frames.py). In UTF-8 each is F3 then three bytes.
FIRST_CALL_CHAR = 0xF0000
MAX_CALLS = 0xFFFE
# A text that holds a call character, or an escape that could write one (a regex's
# \U000Fxxxx or \u{Fxxxx}, a JSON surrogate pair \udb80-\udbbf), keeps no calls: its own
# characters would be read as calls.
NEAR_CALLS = re.compile(
    "[\U000f0000-\U000fffff]|(?i:\\\\U000F|\\\\[ux]\\{0*F[0-9A-F]{4}\\}|\\\\udb[89ab])"
)


class OpaqueCall(Exception):
    """A rewrite read a FrameCall: this schema's recursion cannot be kept as calls (not
    with that definition called, `ptr`)."""

    def __init__(self, message: str, ptr: str | None = None) -> None:
        super().__init__(message)
        self.ptr = ptr


def call_char(frame: int) -> str:
    return chr(FIRST_CALL_CHAR + frame)


class FrameCall(dict[str, Any]):
    """A node that calls frame `frame`: equal to itself alone (its one key says which), and
    opaque to every read."""

    def __init__(self, frame: int, ptr: str | None = None) -> None:
        super().__init__({"$gclmCall": frame})
        self.frame = frame
        self.ptr = ptr  # the definition it calls

    def _opaque(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise OpaqueCall(f"frame {self.frame} was read", self.ptr)

    __getitem__ = __contains__ = __iter__ = _opaque
    get = keys = values = items = copy = setdefault = pop = update = _opaque
    __or__ = __ror__ = __deepcopy__ = __reduce_ex__ = _opaque


def without_calls(node: Any) -> Any:
    """`node` with each FrameCall written as a string naming its frame (for its text: a
    canonical form, a nonce that must not clash with it)."""
    if isinstance(node, FrameCall):
        return f"$gclmCall{node.frame}"
    if isinstance(node, dict):
        return {k: without_calls(v) for k, v in node.items()}
    if isinstance(node, list):
        return [without_calls(v) for v in node]
    return node
