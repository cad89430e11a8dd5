"""A thinking request's text, split into its thinking and its answer, the end marker left out.

The output tracker (output.py) follows the thinking on the token ids (a ReasoningState, or a
ThinkingWatch without a constraint) and decodes each token's text; `MarkerHold` holds back
the text of the thinking's last tokens while they may be the start of the end marker:
dropped when the marker completes, sent as thinking when the match breaks.
"""

from __future__ import annotations

from gclm.masking.reasoning import ReasoningState, ThinkingWatch

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
