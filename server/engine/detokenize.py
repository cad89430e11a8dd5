"""Incremental detokenization: token bytes in, whole UTF-8 text out, stop strings honoured.

Byte-level tokens can split a character (an emoji is often 2-4 tokens), so text is decoded
with an incremental UTF-8 decoder that holds back an incomplete sequence until it completes.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Turns token bytes into text deltas that never end inside a character or inside a
    possible stop string."""

    def __init__(self, token_bytes: Sequence[bytes | None], stop: Sequence[str] = ()):
        self._bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""  # decoded, held back because it may begin a stop string
        self.text = ""  # everything emitted so far
        self.stopped = False  # a stop string was found; the text ends before it

    def push(self, token: int) -> str:
        """Add one token; return the text that can be emitted now (maybe "")."""
        data = self._bytes[token] if 0 <= token < len(self._bytes) else None
        return self._emit(self._decoder.decode(data or b""))

    def flush(self) -> str:
        """End of generation: emit whatever is held back (an incomplete character as U+FFFD)."""
        tail = self._decoder.decode(b"", final=True)
        if self.stopped:
            return ""
        out = self._emit(tail)
        out += self._pending
        self.text += self._pending
        self._pending = ""
        return out

    def _emit(self, new: str) -> str:
        if self.stopped or not new:
            return ""
        if not self._stop:
            self.text += new
            return new
        buf = self._pending + new
        hits = [i for i in (buf.find(s) for s in self._stop) if i >= 0]
        if hits:
            out = buf[: min(hits)]
            self.stopped = True
            self._pending = ""
            self.text += out
            return out
        keep = _longest_stop_prefix(buf, self._stop)
        out, self._pending = buf[: len(buf) - keep], buf[len(buf) - keep :]
        self.text += out
        return out


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
