"""gclm's regexes parsed in compiled code (numba) into a program for compiler/grown/regex_nfa.py.

Python's own parser (`re._parser`) takes 1-3 us a character, seconds on the regexes of
millions of characters that large schemas make. This one reads the dialect gclm's regexes
are written in (compiler/front/json_schema/patterns.py: literals, `\\xHH`, `\\uHHHH`,
`\\UHHHHHHHH`, escaped punctuation, classes with ranges and `^`, `.`, `(...)` and `(?:...)`,
`|`, `*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`, lazy or not, and a final `$`) into flat arrays:
sequences, alternatives, repetitions with their counts, and classes as UTF-8 byte-range
sequences. Anything else (`\\d`, flags, anchors inside, look-around) is refused
(Unsupported), and the caller builds outlines-core's DFA instead. It is checked by
language: tests/compiler/grown/test_lazy_dfa.py walks the DFA made of it beside outlines-core's
over every byte.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from gclm.compiler.numba_cache import cache_per_version

cache_per_version(__file__)

SEQ, ALT, REP, SET = 0, 1, 2, 3
UNBOUNDED = -1


class Unsupported(ValueError):
    """A regex construct the compiled parser does not read."""


_ERRORS = (
    "",
    "an escape the probe does not model",
    "a group with flags or look-around",
    "an anchor inside the regex",
    "unbalanced parentheses",
    "a malformed count",
    "an unterminated class",
    "",  # 7: larger arrays (CompiledProgram retries)
)


@nb.njit(cache=True, nogil=True)
def _utf8_len(cp):
    return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4


@nb.njit(cache=True, nogil=True)
def _utf8_bytes(cp, out):
    n = _utf8_len(cp)
    if n == 1:
        out[0] = cp
    elif n == 2:
        out[0], out[1] = 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F)
    elif n == 3:
        out[0], out[1], out[2] = 0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
    else:
        out[0], out[1] = 0xF0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3F)
        out[2], out[3] = 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
    return n


@nb.njit(cache=True, nogil=True)
def _emit_class(iv_lo, iv_hi, count, b, ranges_at, rng_lo, rng_hi, todo_lo, todo_hi, a, z):
    """Append the UTF-8 byte-range sequences of intervals [0, count) (each interval
    split until every piece is one sequence of byte ranges); b = [sequences, ranges] written
    so far.
    Scratch: todo_lo and todo_hi [64], a and z [4] (allocated once per parse: the parser
    calls this for every character)."""
    for i in range(count):
        todo_lo[0], todo_hi[0] = iv_lo[i], iv_hi[i]
        top = 1
        while top:
            top -= 1
            lo, hi = todo_lo[top], todo_hi[top]
            if lo > hi:
                continue
            if lo <= 0xDFFF and hi >= 0xD800:
                todo_lo[top], todo_hi[top] = lo, 0xD7FF
                todo_lo[top + 1], todo_hi[top + 1] = 0xE000, hi
                top += 2
                continue
            split = False
            for edge in (0x7F, 0x7FF, 0xFFFF):
                if lo <= edge < hi:
                    todo_lo[top], todo_hi[top] = lo, edge
                    todo_lo[top + 1], todo_hi[top + 1] = edge + 1, hi
                    top += 2
                    split = True
                    break
            if split:
                continue
            n = _utf8_len(lo)
            for j in range(1, n):
                m = (1 << (6 * j)) - 1
                if lo & ~m != hi & ~m:
                    if lo & m:
                        todo_lo[top], todo_hi[top] = lo, lo | m
                        todo_lo[top + 1], todo_hi[top + 1] = (lo | m) + 1, hi
                        top += 2
                        split = True
                        break
                    if hi & m != m:
                        todo_lo[top], todo_hi[top] = lo, (hi & ~m) - 1
                        todo_lo[top + 1], todo_hi[top + 1] = hi & ~m, hi
                        top += 2
                        split = True
                        break
            if split:
                continue
            _utf8_bytes(lo, a)
            _utf8_bytes(hi, z)
            for j in range(n):
                rng_lo[b[1]], rng_hi[b[1]] = a[j], z[j]
                b[1] += 1
            b[0] += 1
            ranges_at[b[0]] = b[1]


@nb.njit(cache=True, nogil=True)
def _hex(code, at, digits):
    v = 0
    for i in range(at, at + digits):
        c = code[i] if i < code.size else 0
        if 48 <= c <= 57:
            v = v * 16 + c - 48
        elif 97 <= c <= 102 or 65 <= c <= 70:
            v = v * 16 + (c | 32) - 87
        else:
            return -1
    return v


@nb.njit(cache=True, nogil=True)
def _char(code, at):
    """The codepoint of the (possibly escaped) character at `at` and the next position; a
    negative codepoint for an escape the probe refuses."""
    c = code[at]
    if c != 92:  # not a backslash
        return c, at + 1
    e = code[at + 1] if at + 1 < code.size else 0
    if e == 120:  # x
        return _hex(code, at + 2, 2), at + 4
    if e == 117:  # u
        return _hex(code, at + 2, 4), at + 6
    if e == 85:  # U
        return _hex(code, at + 2, 8), at + 10
    if e == 110:
        return 10, at + 2
    if e == 116:
        return 9, at + 2
    if e == 114:
        return 13, at + 2
    if e == 102:
        return 12, at + 2
    if e == 118:
        return 11, at + 2
    if (48 <= e <= 57) or (65 <= e <= 90) or (97 <= e <= 122):
        return -1, at + 2  # \d, \w, \b, \p, backreferences...
    return e, at + 2


@nb.njit(cache=True, nogil=True)
def _number(code, at):
    v, start = 0, at
    while at < code.size and 48 <= code[at] <= 57:
        v = v * 10 + code[at] - 48
        at += 1
    return (v if at > start else -1), at


@nb.njit(cache=True, nogil=True)
def _ranges_hash(first, last, ranges_at, rng_lo, rng_hi):
    """A 64-bit hash of the byte-range sequences first..last (a dictionary key only)."""
    h = np.uint64(0x9E3779B97F4A7C15)
    for s in range(first, last):
        h = (h ^ np.uint64(ranges_at[s + 1] - ranges_at[s])) * np.uint64(0x100000001B3)
        for r in range(ranges_at[s], ranges_at[s + 1]):
            h = (h ^ np.uint64(rng_lo[r] << 8 | rng_hi[r])) * np.uint64(0x100000001B3)
    return np.int64(h >> np.uint64(1))


@nb.njit(cache=True, nogil=True)
def _same_ranges(a, b, seq_lo, seq_hi, ranges_at, rng_lo, rng_hi):
    """Whether classes a and b are the same byte-range sequences."""
    if seq_hi[a] - seq_lo[a] != seq_hi[b] - seq_lo[b]:
        return False
    for i in range(seq_hi[a] - seq_lo[a]):
        sa, sb = seq_lo[a] + i, seq_lo[b] + i
        n = ranges_at[sa + 1] - ranges_at[sa]
        if n != ranges_at[sb + 1] - ranges_at[sb]:
            return False
        for j in range(n):
            ra, rb = ranges_at[sa] + j, ranges_at[sb] + j
            if rng_lo[ra] != rng_lo[rb] or rng_hi[ra] != rng_hi[rb]:
                return False
    return True


@nb.njit(cache=True, nogil=True)
def _text_hash(code, start, end):
    """A non-negative 64-bit hash of the codepoints code[start:end] (a dictionary key)."""
    h = np.uint64(0xCBF29CE484222325)
    for i in range(start, end):
        h = (h ^ np.uint64(code[i])) * np.uint64(0x100000001B3)
    return np.int64(h >> np.uint64(1))


@nb.njit(cache=True, nogil=True)
def _same_text(code, at, size, start, end):
    """Whether code[at:at + size] and code[start:end] are the same codepoints."""
    if size != end - start:
        return False
    for i in range(size):
        if code[at + i] != code[start + i]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _node_hash(k, kind, p0, p1, kids_lo, kids_hi, kids):
    """A 64-bit hash of node k: its kind, its two numbers, its children's ids."""
    h = np.uint64(0x9E3779B97F4A7C15)
    for x in (kind[k], p0[k], p1[k], kids_hi[k] - kids_lo[k]):
        h = (h ^ np.uint64(x)) * np.uint64(0x100000001B3)
    for j in range(kids_lo[k], kids_hi[k]):
        h = (h ^ np.uint64(kids[j])) * np.uint64(0x100000001B3)
    h = (h ^ (h >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    return h ^ (h >> np.uint64(29))


@nb.njit(cache=True, nogil=True)
def _same_node(a, b, kind, p0, p1, kids_lo, kids_hi, kids):
    if kind[a] != kind[b] or p0[a] != p0[b] or p1[a] != p1[b]:
        return False
    size = kids_hi[a] - kids_lo[a]
    if size != kids_hi[b] - kids_lo[b]:
        return False
    for j in range(size):
        if kids[kids_lo[a] + j] != kids[kids_lo[b] + j]:
            return False
    return True


@nb.njit(cache=True, nogil=True)
def _intern(k, table, hashes, kind, p0, p1, kids_lo, kids_hi, kids):
    """The node equal to node k that was written before it (k itself if none, then
    remembered): an open-addressing table of node + 1 (0: empty) and each slot's hash."""
    h = _node_hash(k, kind, p0, p1, kids_lo, kids_hi, kids)
    mask = table.size - 1
    i = np.int64(h & np.uint64(mask))
    while table[i]:
        other = table[i] - 1
        if hashes[i] == h and _same_node(other, k, kind, p0, p1, kids_lo, kids_hi, kids):
            return other
        i = (i + 1) & mask
    table[i] = k + 1
    hashes[i] = h
    return k


@nb.njit(cache=True, nogil=True)
def _grown_table(table, hashes):
    """The table twice the size, its entries placed again by their hashes."""
    bigger = np.zeros(2 * table.size, dtype=np.int64)
    bigger_hashes = np.zeros(2 * table.size, dtype=np.uint64)
    mask = bigger.size - 1
    for i in range(table.size):
        if table[i]:
            j = np.int64(hashes[i] & np.uint64(mask))
            while bigger[j]:
                j = (j + 1) & mask
            bigger[j], bigger_hashes[j] = table[i], hashes[i]
    return bigger, bigger_hashes


@nb.njit(cache=True, nogil=True)
def _parse(code, kind, p0, p1, kids_lo, kids_hi, kids, seq_lo, seq_hi, ranges_at, rng_lo, rng_hi):
    """Write the program of the regex whose codepoints are `code` into the arrays (nodes:
    2 n + 8 rows; classes' sequences and ranges: what `ranges_at` and `rng_lo` hold);
    returns (error, root), error 7 when the classes need larger arrays.

    Equal subtrees are one node, however often the regex repeats them (a node is looked
    up among those written before it, by its kind, numbers and children, once its children
    are each one node): the program is a DAG whose nodes come after their children. A JSON
    regex repeats itself: Github_ultra o6354's 3.2 M characters made 1.1 M nodes, 570 of
    them distinct, and only those are written."""
    n = code.size
    cap = kind.size
    # Stacks and scratch, each written before it is read (but the bases of depth 0): not
    # zeroed: zeroing them took three quarters of a parse of millions of characters.
    items = np.empty(cap, dtype=np.int64)
    alts = np.empty(cap, dtype=np.int64)
    item_base = np.empty(n + 2, dtype=np.int64)
    alt_base = np.empty(n + 2, dtype=np.int64)
    item_base[0] = alt_base[0] = 0
    written = np.zeros(2, dtype=np.int64)  # sequences, ranges
    iv_lo = np.empty(n + 4, dtype=np.int64)
    iv_hi = np.empty(n + 4, dtype=np.int64)
    merged_lo = np.empty(n + 4, dtype=np.int64)
    merged_hi = np.empty(n + 4, dtype=np.int64)
    todo_lo = np.empty(64, dtype=np.int64)  # _emit_class's scratch
    todo_hi = np.empty(64, dtype=np.int64)
    utf8_lo = np.empty(4, dtype=np.int64)
    utf8_hi = np.empty(4, dtype=np.int64)
    ascii_class = np.full(0x80, -1, dtype=np.int64)  # the class of each ASCII character
    class_of = nb.typed.Dict.empty(key_type=nb.types.int64, value_type=nb.types.int64)
    text_class = nb.typed.Dict.empty(key_type=nb.types.int64, value_type=nb.types.int64)
    entry_at = np.empty(cap, dtype=np.int64)  # text_class's entries: where the text is,
    entry_len = np.empty(cap, dtype=np.int64)  # how long, and its class
    entry_cls = np.empty(cap, dtype=np.int64)
    n_entries = 0
    set_node = np.empty(cap, dtype=np.int64)  # each class's SET node + 1 (0: none yet)
    table = np.zeros(1024, dtype=np.int64)  # the other nodes, for _intern
    hashes = np.zeros(1024, dtype=np.uint64)
    nodes = n_kids = n_items = n_alts = depth = classes = interned = 0
    at = 0
    while True:
        c = code[at] if at < n else -1
        if c == -1 or c == 124 or c == 41:  # end, |, ): close the alternative
            k = nodes
            nodes += 1
            kind[k], p0[k], p1[k] = SEQ, 0, 0
            kids_lo[k] = n_kids
            for i in range(item_base[depth], n_items):
                kids[n_kids] = items[i]
                n_kids += 1
            kids_hi[k] = n_kids
            if 2 * (interned + 1) > table.size:
                table, hashes = _grown_table(table, hashes)
            same = _intern(k, table, hashes, kind, p0, p1, kids_lo, kids_hi, kids)
            if same != k:  # written before: this one is unwritten
                nodes, n_kids, k = k, kids_lo[k], same
            else:
                interned += 1
            n_items = item_base[depth]
            alts[n_alts] = k
            n_alts += 1
            if c == 124:
                at += 1
                continue
            if (c == -1) != (depth == 0):
                return 4, 0
            first = alt_base[depth]
            if n_alts - first == 1:
                node = alts[first]
            else:
                node = nodes
                nodes += 1
                kind[node], p0[node], p1[node] = ALT, 0, 0
                kids_lo[node] = n_kids
                for i in range(first, n_alts):
                    kids[n_kids] = alts[i]
                    n_kids += 1
                kids_hi[node] = n_kids
                if 2 * (interned + 1) > table.size:
                    table, hashes = _grown_table(table, hashes)
                same = _intern(node, table, hashes, kind, p0, p1, kids_lo, kids_hi, kids)
                if same != node:
                    nodes, n_kids, node = node, kids_lo[node], same
                else:
                    interned += 1
            n_alts = first
            if c == -1:
                return 0, node
            depth -= 1
            items[n_items] = node
            n_items += 1
            at += 1
            continue
        if c == 40:  # (
            at += 1
            if at < n and code[at] == 63:  # ?
                if at + 1 < n and code[at + 1] == 58:  # :
                    at += 2
                else:
                    return 2, 0
            depth += 1
            item_base[depth] = n_items
            alt_base[depth] = n_alts
            continue
        if c == 42 or c == 43 or c == 63 or c == 123:  # * + ? {
            low, high = 0, UNBOUNDED
            if c == 43:
                low = 1
            elif c == 63:
                high = 1
            at += 1
            if c == 123:
                low, at = _number(code, at)
                high = low
                if at < n and code[at] == 44:  # ,
                    high, at = _number(code, at + 1)
                    if high < 0:
                        high = UNBOUNDED
                if low < 0 or at >= n or code[at] != 125 or (high != UNBOUNDED and high < low):
                    return 5, 0
                at += 1
            if at < n and code[at] == 63:  # lazy: the same language
                at += 1
            if n_items == item_base[depth]:
                return 5, 0
            k = nodes
            nodes += 1
            kind[k], p0[k], p1[k] = REP, low, high
            kids_lo[k] = n_kids
            kids[n_kids] = items[n_items - 1]
            n_kids += 1
            kids_hi[k] = n_kids
            if 2 * (interned + 1) > table.size:
                table, hashes = _grown_table(table, hashes)
            same = _intern(k, table, hashes, kind, p0, p1, kids_lo, kids_hi, kids)
            if same != k:
                nodes, n_kids, k = k, kids_lo[k], same
            else:
                interned += 1
            items[n_items - 1] = k
            continue
        if c == 36:  # $
            if at != n - 1:
                return 3, 0
            at += 1
            continue
        if c == 94:  # ^
            return 3, 0
        start = at  # the class's text: code[start:at] once it is read
        count = 0
        negate = False
        if c == 46:  # .
            iv_lo[0], iv_hi[0], iv_lo[1], iv_hi[1] = 0, 9, 11, 0x10FFFF
            count = 2
            at += 1
        elif c == 91:  # [
            at += 1
            if at < n and code[at] == 94:
                negate = True
                at += 1
            while True:
                if at >= n:
                    return 6, 0
                if code[at] == 93:
                    at += 1
                    break
                lo, at = _char(code, at)
                hi = lo
                if at + 1 < n and code[at] == 45 and code[at + 1] != 93:  # a range
                    hi, at = _char(code, at + 1)
                if lo < 0 or hi < 0:
                    return 1, 0
                iv_lo[count], iv_hi[count] = lo, hi
                count += 1
        else:
            lo, at = _char(code, at)
            if lo < 0:
                return 1, 0
            iv_lo[0], iv_hi[0] = lo, lo
            count = 1
        # A class met before by the same text is that class, without sorting, merging and
        # splitting it into UTF-8 again (kb_794 has 160 k classes other than one ASCII
        # character, mostly the same few strings' characters).
        text = -1
        if count == 1 and not negate and iv_lo[0] == iv_hi[0] < 0x80:
            cls = ascii_class[iv_lo[0]]  # one ASCII character: its table (-1: none yet)
        else:
            cls = -1
            text = _text_hash(code, start, at)
            entry = text_class[text] if text in text_class else -1
            if entry >= 0 and _same_text(code, entry_at[entry], entry_len[entry], start, at):
                cls = entry_cls[entry]
        if cls < 0:
            # Sort and merge the intervals (a class is short: insertion sort), complement.
            for i in range(1, count):
                a, b = iv_lo[i], iv_hi[i]
                j = i - 1
                while j >= 0 and iv_lo[j] > a:
                    iv_lo[j + 1], iv_hi[j + 1] = iv_lo[j], iv_hi[j]
                    j -= 1
                iv_lo[j + 1], iv_hi[j + 1] = a, b
            m = 0
            for i in range(count):
                if m and iv_lo[i] <= merged_hi[m - 1] + 1:
                    merged_hi[m - 1] = max(merged_hi[m - 1], iv_hi[i])
                else:
                    merged_lo[m], merged_hi[m] = iv_lo[i], iv_hi[i]
                    m += 1
            if negate:
                out, nxt = 0, 0
                for i in range(m):
                    if nxt < merged_lo[i]:
                        iv_lo[out], iv_hi[out] = nxt, merged_lo[i] - 1
                        out += 1
                    nxt = merged_hi[i] + 1
                if nxt <= 0x10FFFF:
                    iv_lo[out], iv_hi[out] = nxt, 0x10FFFF
                    out += 1
                for i in range(out):
                    merged_lo[i], merged_hi[i] = iv_lo[i], iv_hi[i]
                m = out
            # Equal classes are one class however often they come (a JSON regex is mostly the
            # same literals and string characters: Kubernetes kb_794's 2.8 M characters made
            # 627 k classes, 160 k of them other than one ASCII character; 72 are distinct).
            char = merged_lo[0] if m == 1 and merged_lo[0] == merged_hi[0] < 0x80 else -1
            if char >= 0 and ascii_class[char] >= 0:
                cls = ascii_class[char]
            else:
                # An interval splits into at most 18 sequences of at most 4 ranges.
                if written[0] + 18 * m + 1 >= ranges_at.size or written[1] + 72 * m >= rng_lo.size:
                    return 7, 0
                first_seq, first_rng = written[0], written[1]
                seq_lo[classes] = first_seq
                if m == 1 and merged_hi[0] < 0x80:  # one ASCII range: one sequence of one range
                    rng_lo[written[1]], rng_hi[written[1]] = merged_lo[0], merged_hi[0]
                    written[1] += 1
                    written[0] += 1
                    ranges_at[written[0]] = written[1]
                else:
                    _emit_class(merged_lo, merged_hi, m, written, ranges_at, rng_lo, rng_hi,
                                todo_lo, todo_hi, utf8_lo, utf8_hi)  # fmt: skip
                seq_hi[classes] = written[0]
                cls = classes
                if char < 0:  # the same ranges as a class met before: that class, these unwritten
                    h = _ranges_hash(first_seq, written[0], ranges_at, rng_lo, rng_hi)
                    same = class_of[h] if h in class_of else -1
                    if same >= 0 and _same_ranges(same, classes, seq_lo, seq_hi, ranges_at,
                                                  rng_lo, rng_hi):  # fmt: skip
                        cls = same
                        written[0], written[1] = first_seq, first_rng
                    elif same < 0:
                        class_of[h] = classes
                if cls == classes:
                    classes += 1
                    set_node[cls] = 0
                    if char >= 0:
                        ascii_class[char] = cls
            if text != -1 and text not in text_class:
                text_class[text] = n_entries
                entry_at[n_entries], entry_len[n_entries] = start, at - start
                entry_cls[n_entries] = cls
                n_entries += 1
        if set_node[cls] == 0:
            k = nodes
            nodes += 1
            kind[k], p0[k], p1[k] = SET, cls, 0
            kids_lo[k] = kids_hi[k] = n_kids
            set_node[cls] = k + 1
        items[n_items] = set_node[cls] - 1
        n_items += 1


class ParsedRegex:
    """A regex's program, a DAG (equal subtrees are one node, written after its children):
    node k has `kind[k]`, two numbers (a repetition's low and high, a set's class), and
    children `kids[kids_lo[k]:kids_hi[k]]`; class c is the byte-range
    sequences `seq_lo[c]..seq_hi[c]`, sequence s the ranges `rng_at[s]..rng_at[s+1]`
    (`arrays()`, in that order). Raises Unsupported for what the parser does not read."""

    def __init__(self, regex: str) -> None:
        code = np.frombuffer(regex.encode("utf-32-le"), dtype=np.uint32)
        n, room = code.size, 4
        while True:
            # Room for the most a regex of n characters writes, most of it never touched:
            # not zeroed (_parse writes each row before it reads it), since below glibc's
            # mmap threshold (up to 32 MB) zeroing it wrote every page.
            nodes = [np.empty(2 * n + 8, dtype=np.int64) for _ in range(6)]
            classes = [np.empty(2 * n + 8, dtype=np.int64) for _ in range(2)]
            ranges = [np.empty(room * n + 64, dtype=np.int64) for _ in range(3)]
            ranges[0][0] = 0  # the first sequence's ranges start at 0
            error, self.root = _parse(code, *nodes, *classes, *ranges)
            if error != 7:
                break
            room *= 4
        if error:
            raise Unsupported(_ERRORS[error])
        self._arrays = (*nodes, *classes, *ranges)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return self._arrays
