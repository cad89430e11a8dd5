"""Response bodies in the shapes the official openai SDK parses.

A `Renderer` knows one endpoint's shapes: chat ("chat.completion", "chatcmpl-" ids, role
and content deltas) or text completions ("text_completion", "cmpl-" ids, text deltas); the
Responses API's renderer lives in responses_api.py. The HTTP layer feeds it engine events
and sends what it returns, framed by the renderer (`frame`, `failure`, `done`).

Logprobs, when asked for, are in OpenAI's shapes: chat's `{"content": [{token, logprob,
bytes, top_logprobs}]}` and the legacy completions' `{tokens, token_logprobs, top_logprobs,
text_offset}`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, SerializeAsAny

from gclm.server.engine.protocol import FinishEvent, TokenLogprob
from gclm.server.http.streaming import DONE, sse, sse_error


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # the prompt's prefix whose KV the engine reused


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0  # the model does not reason before answering


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
            completion_tokens_details=CompletionTokensDetails(),
        )


@dataclass
class ChoiceOutput:
    """One choice's whole output, collected from its events."""

    text: str = ""
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None  # None: not asked for
    reasoning: str = ""  # a thinking request's thinking (server/openai/reasoning.py)
    reasoning_tokens: int = 0


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None

    @classmethod
    def of(cls, lp: TokenLogprob) -> TopLogprob:
        return cls(token=lp.token, logprob=lp.logprob, bytes=_bytes(lp))


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]

    @classmethod
    def of(cls, lp: TokenLogprob) -> ChatTokenLogprob:
        top = [TopLogprob.of(t) for t in lp.top]
        return cls(token=lp.token, logprob=lp.logprob, bytes=_bytes(lp), top_logprobs=top)


def _bytes(lp: TokenLogprob) -> list[int] | None:
    return None if lp.bytes is None else list(lp.bytes)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None

    @classmethod
    def of(cls, logprobs: Sequence[TokenLogprob] | None) -> ChatLogprobs | None:
        if logprobs is None:
            return None
        return cls(content=[ChatTokenLogprob.of(lp) for lp in logprobs])


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


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "gclm"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Renderer:
    """Builds one response's bodies; subclasses fix the endpoint's shapes.

    A stream is: `opening`, then `delta` per text piece and `finish` per choice as they
    come, then `closing`; each body is sent with `frame`, and `done` (if any) ends it. An
    error mid-stream sends `failure` instead and ends the stream.
    """

    id_prefix = ""
    done: bytes | None = DONE  # the stream's last line

    def __init__(self, model: str) -> None:
        self.id = self.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model

    def frame(self, body: BaseModel) -> bytes:
        return sse(body)

    def failure(self, error: BaseException) -> list[bytes]:
        """What ends a stream that failed: the OpenAI error object, then [DONE]."""
        return [sse_error(error), DONE]

    def opening(self, n: int) -> list[BaseModel]:
        """Chunks sent before any text (chat: the role of each choice)."""
        return []

    def delta(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None
    ) -> BaseModel | None:
        """A piece of text (logprobs: one per token in it, None when not asked for); None
        when there is nothing to send yet (a tool call's text held back)."""
        raise NotImplementedError

    def deltas(
        self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None
    ) -> list[BaseModel]:
        """What a piece of text sends: `delta`'s body, if any (a renderer that announces
        output items as it reads them sends several)."""
        chunk = self.delta(index, text, logprobs)
        return [] if chunk is None else [chunk]

    def finish_reason(self, event: FinishEvent) -> str:
        """The finish_reason to report: the engine's, where a constrained output cut by the
        budget is complete, so "stop". A renderer of free text under a constraint (tool_choice
        "auto") reports such a cut as "length"."""
        return event.finish_reason

    def reasoning_delta(self, index: int, text: str) -> BaseModel | None:
        """A piece of thinking text (server/openai/reasoning.py); None: not sent."""
        return None

    def finish(self, index: int, finish_reason: str) -> list[BaseModel]:
        raise NotImplementedError

    def closing(self, usage: Usage, include_usage: bool) -> list[BaseModel]:
        """After every choice finished: a usage-only chunk when stream_options asks for it."""
        return [self.usage(usage)] if include_usage else []

    def usage(self, usage: Usage) -> BaseModel:
        raise NotImplementedError

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
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


class CompletionRenderer(Renderer):
    id_prefix = "cmpl-"

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self._sent: dict[int, int] = {}  # choice -> characters streamed (for text_offset)

    def _body(self, choices: list[CompletionChoice], usage: Usage | None = None) -> BaseModel:
        return Completion(
            id=self.id, created=self.created, model=self.model, choices=choices, usage=usage
        )

    def delta(self, index: int, text: str, logprobs: Sequence[TokenLogprob] | None) -> BaseModel:
        start = self._sent.get(index, 0)
        self._sent[index] = start + len(text)
        lp = None if logprobs is None else CompletionLogprobs.of(logprobs, start)
        return self._body([CompletionChoice(index=index, text=text, logprobs=lp)])

    def finish(self, index: int, finish_reason: str) -> list[BaseModel]:
        return [self._body([CompletionChoice(index=index, text="", finish_reason=finish_reason)])]

    def usage(self, usage: Usage) -> BaseModel:
        return self._body([], usage)

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
