"""Chat bodies of a thinking request (server/openai/reasoning.py decides who thinks):
`message.reasoning` (and `reasoning_content`, its older name) beside the answer in `content`,
and stream deltas of each; `include_reasoning: false` leaves the thinking text out.
"""

from __future__ import annotations

from pydantic import BaseModel, SerializeAsAny

from gclm.server.openai.chat.render import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatRenderer,
)
from gclm.server.openai.chat.tool_calls import ToolCallMessage, ToolChatRenderer
from gclm.server.openai.reasoning import ReasoningParser
from gclm.server.openai.render import ChoiceOutput, Usage
from gclm.server.openai.tools.calls import Call


class ReasoningMessage(AssistantMessage):
    """An assistant message with its thinking (both of vLLM's names)."""

    reasoning: str | None = None
    reasoning_content: str | None = None


def reasoning_delta(text: str) -> dict[str, str]:
    """A stream delta of thinking text, under both names."""
    return {"reasoning": text, "reasoning_content": text}


class ReasoningChatCompletion(ChatCompletion):
    usage: SerializeAsAny[Usage]


class ReasoningChatChunk(ChatCompletionChunk):
    usage: SerializeAsAny[Usage] | None = None


class ThinkingText(ChatRenderer):
    """What a thinking request's chat renderer adds: the thinking text, streamed as
    `reasoning` deltas and beside the answer in the message, or left out
    (`include_reasoning: false`)."""

    def __init__(self, model: str, parser: ReasoningParser, include: bool = True) -> None:
        super().__init__(model)
        self.parser = parser
        self.include = include
        self._started: set[int] = set()  # choices whose thinking has begun streaming

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> BaseModel:
        return ReasoningChatChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def reasoning_delta(self, index: int, text: str) -> BaseModel | None:
        if not self.include:
            return None
        if index not in self._started:
            self._started.add(index)
            text = self.parser.strip_start(text)
        if not text:
            return None
        return self._chunk([ChatChunkChoice(index=index, delta=reasoning_delta(text))])

    def thought(self, out: ChoiceOutput) -> str | None:
        """A choice's thinking text as the message carries it (None: left out)."""
        return self.parser.strip_start(out.reasoning) if self.include else None


class ReasoningChatRenderer(ThinkingText):
    """Chat bodies of a thinking request: the thinking beside the answer."""

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
        choices = []
        for i, out in enumerate(outputs):
            thought = self.thought(out)
            message = ReasoningMessage(
                content=out.text, reasoning=thought, reasoning_content=thought
            )
            logprobs = ChatLogprobs.of(out.logprobs)
            choices.append(
                ChatChoice(
                    index=i, message=message, logprobs=logprobs, finish_reason=out.finish_reason
                )
            )
        return ReasoningChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


class ReasoningToolCallMessage(ToolCallMessage):
    """A tool-call message with the thinking before the calls (both of vLLM's names)."""

    reasoning: str | None = None
    reasoning_content: str | None = None


class ReasoningToolChatRenderer(ThinkingText, ToolChatRenderer):
    """Chat bodies of a thinking request with tools: the thinking, then the calls (or text)."""

    def message(self, out: ChoiceOutput, calls: list[Call]) -> AssistantMessage:
        plain = super().message(out, calls)
        shape = ReasoningToolCallMessage if calls else ReasoningMessage
        thought = self.thought(out)
        return shape(**dict(plain), reasoning=thought, reasoning_content=thought)
