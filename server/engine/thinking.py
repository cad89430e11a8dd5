"""A thinking request's text, split into its thinking and its answer, the end marker left out.

Both engines follow the thinking on the token ids (a ReasoningState, or a ThinkingWatch
without a constraint) and decode each token's text; `MarkerHold` holds back the text of the
thinking's last tokens while they may be the start of the end marker: dropped when the
marker completes, sent as thinking when the match breaks. `ThinkingSplit` adds the
detokenizer, for an engine that gets token ids in batches (vLLM's DELTA outputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gclm.masking.reasoning import ReasoningState, ThinkingWatch
from gclm.server.engine.transformers.detokenize import TextStream

Watch = ReasoningState | ThinkingWatch


class MarkerHold:
    """The thinking text that may be the start of the end marker, held back."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[str] = []  # one entry per token, the last `watch.matched` tokens'

    def push(self, text: str, watch: Watch) -> str:
        """Take one thinking token's `text` (`watch` has already taken the token) and
        return the thinking text that can be sent now: none once the marker is complete
        (its text is dropped), else all but the text of the tokens that may begin it."""
        held = self._held
        held.append(text)
        if not watch.thinking:
            held.clear()
            return ""
        sent = len(held) - watch.matched
        out = "".join(held[:sent])
        del held[:sent]
        return out

    def flush(self) -> str:
        """The held text, at the end of an output cut off while thinking."""
        out = "".join(self._held)
        self._held.clear()
        return out


@dataclass(frozen=True)
class Part:
    """A run of consecutive tokens of one kind (thinking or answer) and their text."""

    reasoning: bool
    text: str
    positions: range  # the tokens' indices in the batch given to ThinkingSplit.push


@dataclass(eq=False)
class ThinkingSplit:
    """Decodes a thinking request's tokens, follows its thinking on them (`watch`, which
    `push` advances: the request's ReasoningState, or a ThinkingWatch) and splits them into
    thinking and answer."""

    watch: Watch
    token_bytes: Sequence[bytes | None]
    stop: Sequence[str] = ()
    text: TextStream = field(init=False)
    hold: MarkerHold = field(default_factory=MarkerHold, init=False)

    def __post_init__(self) -> None:
        self.text = TextStream(self.token_bytes, self.stop)

    def push(self, tokens: Sequence[int]) -> list[Part]:
        """Take `tokens` (no EOS); return their parts, in order."""
        parts: list[Part] = []
        for i, token in enumerate(tokens):
            was_thinking = self.watch.thinking
            self.watch.advance(token)
            text = self.text.push(token)
            if was_thinking:
                text = self.hold.push(text, self.watch)
            last = parts[-1] if parts else None
            if last is not None and last.reasoning == was_thinking:
                parts[-1] = Part(was_thinking, last.text + text, range(last.positions.start, i + 1))
            else:
                parts.append(Part(was_thinking, text, range(i, i + 1)))
        return parts

    def flush(self) -> Part:
        """The text held back at the end: thinking when cut off while thinking."""
        if self.watch.thinking:
            return Part(True, self.hold.flush() + self.text.flush(), range(0))
        return Part(False, self.text.flush(), range(0))

    @property
    def stopped(self) -> bool:
        """A stop string ended the text."""
        return self.text.stopped
