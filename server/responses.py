"""Response bodies in the shapes the official openai SDK parses.

A `Renderer` knows one endpoint's shapes: chat ("chat.completion", "chatcmpl-" ids, role
and content deltas) or text completions ("text_completion", "cmpl-" ids, text deltas). The
HTTP layer feeds it engine events and sends what it returns.
"""

from __future__ import annotations

import secrets
import time
from typing import Literal

from pydantic import BaseModel


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None  # gclm never refuses; the SDK's parse() reads this field


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None = None
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
    delta: dict[str, str]  # {"role": "assistant"} first, then {"content": ...}, then {}
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    """A text completion; streamed chunks have the same shape and object name."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "gclm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Renderer:
    """Builds one response's bodies; subclasses fix the endpoint's shapes."""

    id_prefix = ""

    def __init__(self, model: str) -> None:
        self.id = self.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model

    def opening(self, n: int) -> list[BaseModel]:
        """Chunks sent before any text (chat: the role of each choice)."""
        return []

    def delta(self, index: int, text: str) -> BaseModel:
        raise NotImplementedError

    def finish(self, index: int, finish_reason: str) -> BaseModel:
        raise NotImplementedError

    def usage(self, usage: Usage) -> BaseModel:
        """The last chunk when stream_options.include_usage: no choices, only usage."""
        raise NotImplementedError

    def final(self, texts: list[str], finish_reasons: list[str], usage: Usage) -> BaseModel:
        """The non-streaming response."""
        raise NotImplementedError


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

    def delta(self, index: int, text: str) -> BaseModel:
        return self._chunk([ChatChunkChoice(index=index, delta={"content": text})])

    def finish(self, index: int, finish_reason: str) -> BaseModel:
        return self._chunk([ChatChunkChoice(index=index, delta={}, finish_reason=finish_reason)])

    def usage(self, usage: Usage) -> BaseModel:
        return self._chunk([], usage)

    def final(self, texts: list[str], finish_reasons: list[str], usage: Usage) -> BaseModel:
        choices = [
            ChatChoice(index=i, message=AssistantMessage(content=text), finish_reason=reason)
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
        return ChatCompletion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )


class CompletionRenderer(Renderer):
    id_prefix = "cmpl-"

    def _body(self, choices: list[CompletionChoice], usage: Usage | None = None) -> BaseModel:
        return Completion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def delta(self, index: int, text: str) -> BaseModel:
        return self._body([CompletionChoice(index=index, text=text)])

    def finish(self, index: int, finish_reason: str) -> BaseModel:
        return self._body([CompletionChoice(index=index, text="", finish_reason=finish_reason)])

    def usage(self, usage: Usage) -> BaseModel:
        return self._body([], usage)

    def final(self, texts: list[str], finish_reasons: list[str], usage: Usage) -> BaseModel:
        choices = [
            CompletionChoice(index=i, text=text, finish_reason=reason)
            for i, (text, reason) in enumerate(zip(texts, finish_reasons, strict=True))
        ]
        return self._body(choices, usage)
