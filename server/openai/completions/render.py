"""Text completion bodies, in the shapes the official openai SDK parses: "text_completion",
"cmpl-" ids, text deltas; logprobs as the legacy `{tokens, token_logprobs, top_logprobs,
text_offset}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from gclm.server.engine.protocol import TokenLogprob
from gclm.server.openai.output import Delta, Finished
from gclm.server.openai.render import ChoiceOutput, Renderer, Usage


class CompletionLogprobs(BaseModel):
    """The legacy completions' logprobs: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def of(cls, logprobs: Sequence[TokenLogprob], start: int = 0) -> CompletionLogprobs:
        """`start`: the offset in the choice's text of the first token."""
        # Offsets in characters; a token that splits a character starts where it starts.
        offsets, data = [], b""
        for lp in logprobs:
            offsets.append(start + len(data.decode("utf-8", "ignore")))
            data += lp.bytes or b""
        return cls(
            tokens=[lp.token for lp in logprobs],
            token_logprobs=[lp.logprob for lp in logprobs],
            top_logprobs=[{t.token: t.logprob for t in lp.top} for lp in logprobs],
            text_offset=offsets,
        )


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    """A text completion; streamed chunks have the same shape and object name."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionRenderer(Renderer):
    id_prefix = "cmpl-"

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._sent: dict[int, int] = {}  # choice -> characters streamed (for text_offset)

    def _body(self, choices: list[CompletionChoice], usage: Usage | None = None) -> BaseModel:
        return Completion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def delta(self, piece: Delta) -> list[BaseModel]:
        index, text = piece.index, piece.content  # plain text: read as it came
        start = self._sent.get(index, 0)
        self._sent[index] = start + len(text)
        lp = None if piece.logprobs is None else CompletionLogprobs.of(piece.logprobs, start)
        return [self._body([CompletionChoice(index=index, text=text, logprobs=lp)])]

    def finish(self, end: Finished) -> list[BaseModel]:
        choice = CompletionChoice(index=end.index, text="", finish_reason=end.finish_reason)
        return [self._body([choice])]

    def closing(self, usage: Usage, include_usage: bool) -> list[BaseModel]:
        return [self._body([], usage)] if include_usage else []

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
        choices = [
            CompletionChoice(
                index=i,
                text=out.text,
                logprobs=None if out.logprobs is None else CompletionLogprobs.of(out.logprobs),
                finish_reason=out.finish_reason,
            )
            for i, out in enumerate(outputs)
        ]
        return self._body(choices, usage)
