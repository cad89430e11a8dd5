"""What every endpoint's bodies share: usage, a choice's collected output, token logprobs, the
model list, and the `Renderer` interface (chat/render.py, completions/render.py,
responses/render.py implement it).

A `Renderer` knows one endpoint's shapes. The serving pipeline (serving.py) feeds it engine
events and sends what it returns, framed by the renderer (`frame`, `failure`, `done`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from gclm.server.engine.protocol import TokenLogprob
from gclm.server.http.streaming import DONE, sse, sse_error
from gclm.server.openai.output import PLAIN, OutputSpec


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

    def with_reasoning_tokens(self, reasoning_tokens: int | None) -> Usage:
        """This usage with completion_tokens_details.reasoning_tokens (a thinking request's)."""
        if reasoning_tokens is None:
            return self
        details = CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
        return self.model_copy(update={"completion_tokens_details": details})


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
        return cls(token=lp.token, logprob=lp.logprob, bytes=token_bytes(lp))


def token_bytes(lp: TokenLogprob) -> list[int] | None:
    return None if lp.bytes is None else list(lp.bytes)


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
    come, then `closing` (and `settle`, before it is sent); each body is sent with `frame`,
    and `done` (if any) ends it. An error mid-stream sends `failure` instead and ends the
    stream.
    """

    id_prefix = ""
    done: bytes | None = DONE  # the stream's last line

    def __init__(self, model: str, output: OutputSpec = PLAIN) -> None:
        self.id = self.id_prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model
        self.output = output  # what the output holds: the parsers that read it (output.py)

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

    async def settle(self) -> None:
        """The whole answer is built (`final`, or a stream's `closing`), and its last bytes
        not yet sent: the Responses API stores it here (responses/store.py), so a client that
        reads the end can chain a next turn on it at once. Other APIs keep nothing."""
