"""What every endpoint's bodies share: usage, a choice's collected output, token logprobs, the
model list, and the `Renderer` interface (chat/render.py, completions/render.py,
responses/render.py implement it).

A `Renderer` knows one endpoint's shapes. The serving pipeline (serving.py) reads each engine
event once (output.py), hands the renderer what it read, and sends the bodies it returns,
framed by the renderer (`frame`, `failure`, `done`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from gclm.server.engine.protocol import TokenLogprob
from gclm.server.http.streaming import DONE, sse, sse_error
from gclm.server.openai.output import PLAIN, Delta, Finished, OutputSpec, Read
from gclm.server.openai.tools.calls import Call


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
    """One choice's whole output, collected from its events, and what its output parsers
    read in it (output.py), once."""

    text: str = ""
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None  # None: not asked for
    reasoning: str = ""  # a thinking request's thinking (server/openai/reasoning.py)
    reasoning_tokens: int = 0
    read: Read = field(default_factory=Read)  # the answer and thinking as read
    calls: list[Call] = field(default_factory=list)  # the calls read (none: the answer is text)


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

    A stream is: `opening`; then, as each choice's events come, read once by its output
    parsers (output.py's StreamReader), `reasoning_delta` per piece of thinking, `delta` per
    piece of answer (a `Delta`) and `finish` per choice's end (a `Finished`); then `closing`
    (and `settle`, before it is sent). Each returns the bodies its step sends, written once
    here from what it is handed; each body is sent with `frame`, and `done` (if any) ends the
    stream. An error mid-stream sends `failure` instead and ends the stream.
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

    def reasoning_delta(self, index: int, text: str) -> list[BaseModel]:
        """A piece of choice `index`'s thinking, as read (never empty); none: not sent."""
        return []

    def delta(self, piece: Delta) -> list[BaseModel]:
        """A piece of a choice's answer, as read: none when there is nothing to send yet (a
        tool call's text held back); a renderer that announces items as they come, several."""
        raise NotImplementedError

    def finish(self, end: Finished) -> list[BaseModel]:
        """A choice's end, as read: what was held back, then its finish."""
        raise NotImplementedError

    def closing(self, usage: Usage, include_usage: bool) -> list[BaseModel]:
        """After every choice finished: a usage-only chunk when stream_options asks for it."""
        raise NotImplementedError

    def final(self, outputs: list[ChoiceOutput], usage: Usage) -> BaseModel:
        """The non-streaming response."""
        raise NotImplementedError

    async def settle(self) -> None:
        """The whole answer is built (`final`, or a stream's `closing`), and its last bytes
        not yet sent: the Responses API stores it here (responses/store.py), so a client that
        reads the end can chain a next turn on it at once. Other APIs keep nothing."""
