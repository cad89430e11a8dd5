"""Chat completion bodies, in the shapes the official openai SDK parses: "chat.completion",
"chatcmpl-" ids, role and content deltas; logprobs as `{"content": [{token, logprob, bytes,
top_logprobs}]}`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, SerializeAsAny

from gclm.server.engine.protocol import TokenLogprob
from gclm.server.openai.render import ChoiceOutput, Renderer, TopLogprob, Usage, token_bytes


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]

    @classmethod
    def of(cls, lp: TokenLogprob) -> ChatTokenLogprob:
        top = [TopLogprob.of(t) for t in lp.top]
        return cls(token=lp.token, logprob=lp.logprob, bytes=token_bytes(lp), top_logprobs=top)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None

    @classmethod
    def of(cls, logprobs: Sequence[TokenLogprob] | None) -> ChatLogprobs | None:
        if logprobs is None:
            return None
        return cls(content=[ChatTokenLogprob.of(lp) for lp in logprobs])


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None  # gclm never refuses; the SDK's parse() reads this field


class ChatChoice(BaseModel):
    index: int
    message: SerializeAsAny[AssistantMessage]  # tool_calls.ToolCallMessage adds tool_calls
    logprobs: ChatLogprobs | None = None
    finish_reason: str


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int
    # {"role": "assistant"} first, then {"content": ...} (or {"tool_calls": [...]}), then {}
    delta: dict[str, Any]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ChatRenderer(Renderer):
    id_prefix = "chatcmpl-"

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> BaseModel:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def opening(self, n: int) -> list[BaseModel]:
        return [
            self._chunk([ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})])
            for i in range(n)
        ]

    def delta(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None
    ) -> BaseModel | None:
        choice = ChatChunkChoice(
            index=index, delta={"content": text}, logprobs=ChatLogprobs.of(logprobs)
        )
        return self._chunk([choice])

    def finish(self, index: int, finish_reason: str) -> list[BaseModel]:
        return [self._chunk([ChatChunkChoice(index=index, delta={}, finish_reason=finish_reason)])]

    def usage(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
        choices = [
            ChatChoice(
                index=i,
                message=AssistantMessage(content=out.text),
                logprobs=ChatLogprobs.of(out.logprobs),
                finish_reason=out.finish_reason,
            )
            for i, out in enumerate(outputs)
        ]
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )
