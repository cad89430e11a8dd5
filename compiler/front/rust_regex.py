"""Raw regexes from users: Rust `regex` syntax, checked before the DFA is built.

outlines-core compiles Rust regex syntax; this module refuses what it cannot index (start
anchors inside the pattern, look-around, backreferences, Unicode word boundaries) with a
message that says why, and strips the anchors the whole-output match makes redundant.
"""

from __future__ import annotations

import re

import outlines_core

from gclm.errors import CompileLimitError, ConstraintError, quote


def matches_empty(pattern: str) -> bool:
    try:
        return re.fullmatch(pattern, "") is not None
    except re.error:
        return False  # Rust-only syntax: assume not; the compile stage reports otherwise


def strip_anchors(pattern: str) -> str:
    """Drop a leading `^` and a trailing `$`: outlines-core matches the whole output anyway.

    A leading `^` must go: outlines-core cannot build an Index for a regex whose start
    state depends on look-behind ("anchored universal start state doesn't exist").
    """
    if pattern.startswith("^"):
        pattern = pattern[1:]
    trailing_backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    if pattern.endswith("$") and trailing_backslashes % 2 == 0:
        pattern = pattern[:-1]
    return pattern


_PROBE_VOCABULARY: outlines_core.Vocabulary | None = None
# A counted repetition past this is refused before the DFA is built (the JSON Schema side
# has the same limit on minLength and minItems): `x{1000000000}` would otherwise hold a
# compile worker until its CPU limit.
MAX_COUNT = 10_000
_COUNTED = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def check_regex(pattern: str) -> str:
    """Return `pattern` if it compiles in outlines-core's dialect (Rust `regex`), else raise.

    Compiles `(?:pattern){0}`: the parser checks all of it, and the empty repetition keeps
    the DFA (the slow part, done later by the compile stage) to one state.

    Raises:
        ConstraintError: the regex does not compile, with the likely reason.
    """
    global _PROBE_VOCABULARY
    if _PROBE_VOCABULARY is None:
        _PROBE_VOCABULARY = outlines_core.Vocabulary(1, {"\x00": [0]})
    problem = _unbalanced(pattern)
    if problem is None and re.search(r"(?<!\\)(?:\\\\)*\\[bB]", pattern):
        # The probe drops the body before the DFA is built, so this would surface later.
        problem = "Unicode word boundaries ('\\b') cannot be compiled to a DFA; use (?-u:\\b)"
    if problem is None:
        try:
            outlines_core.Index(f"(?:{pattern}){{0}}", _PROBE_VOCABULARY)
        except ValueError as e:
            if "Failed to build DFA" in str(e):
                problem = _diagnose(pattern)
    count = largest_count(pattern)
    if problem is None and count > MAX_COUNT:
        raise CompileLimitError(
            f"The regex {quote(pattern)} repeats a part {count:,} times, over gclm's limit of "
            f"{MAX_COUNT:,}: each repetition is automaton states over the whole vocabulary, "
            "so it cannot compile within the compile limits. Use a smaller count."
        )
    if problem is not None:
        raise ConstraintError(
            f"The regex {quote(pattern)} does not compile: {problem}. gclm uses Rust regex syntax "
            "(https://docs.rs/regex), without look-around or backreferences."
        )
    return pattern


def largest_count(pattern: str) -> int:
    """The largest bound of a counted repetition (`{n}`, `{n,}`, `{n,m}`) outside classes."""
    largest, i, in_class = 0, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            in_class += 1
        elif ch == "]" and in_class:
            in_class -= 1
        elif ch == "{" and not in_class:
            counted = _COUNTED.match(pattern, i)
            if counted:
                largest = max(largest, *(int(n) for n in counted.groups() if n))
        i += 1
    return largest


def _unbalanced(pattern: str) -> str | None:
    """A reason if parentheses outside classes do not balance (the probe's group would hide
    it), or if a start anchor is left inside the pattern (outlines-core cannot index it)."""
    depth, i, in_class = 0, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            if pattern[i + 1 : i + 2] == "A" and not in_class:
                return "a '\\A' anchor inside the regex (the whole output is matched; remove it)"
            i += 2
            continue
        if ch == "[":
            in_class += 1
            # A `]` right after `[` or `[^` is a literal, not the end of the class.
            i += 3 if pattern[i + 1 : i + 3] == "^]" else 2 if pattern[i + 1 : i + 2] == "]" else 1
            continue
        if ch == "]" and in_class:
            in_class -= 1
        elif ch == "^" and not in_class:
            return "a '^' anchor inside the regex (the whole output is matched; remove it)"
        elif ch == "(" and not in_class:
            depth += 1
        elif ch == ")" and not in_class:
            depth -= 1
            if depth < 0:
                return "an unmatched ')'"
        i += 1
    return "an unclosed '('" if depth > 0 else None


def _diagnose(pattern: str) -> str:
    checks = [
        ("(?=", "look-ahead '(?=' is not supported"),
        ("(?!", "look-ahead '(?!' is not supported"),
        ("(?<=", "look-behind '(?<=' is not supported"),
        ("(?<!", "look-behind '(?<!' is not supported"),
    ]
    for needle, reason in checks:
        if needle in pattern:
            return reason
    if re.search(r"(?<!\\)(?:\\\\)*\\[1-9]", pattern):
        return "backreferences like '\\1' are not supported"
    try:
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as e:
        return parse_problem(e)
    return "a syntax error"


def parse_problem(e: Exception) -> str:
    """A short reason for a failure of Python's regex parser, without the pattern's text."""
    if isinstance(e, OverflowError):
        return "a repetition count is too large"
    if isinstance(e, RecursionError):
        return "groups nest too deeply"
    if isinstance(e, re.error):
        return f"a syntax error ({e.msg} at position {e.pos})"
    return "a syntax error"
