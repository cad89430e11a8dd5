"""What both real engines share: prompts, admission checks, event streams and stats.

`BatchEngine` (transformers) and `VllmEngine` differ in how they generate; everything a
request meets before that (the chat template, the prompt's length in characters, the
checks that refuse a request no engine could serve) and after it (a handle's queue of
events, the table cache's and compile pool's gauges through the engine's Constraints) is
written once, here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from functools import cached_property
from typing import Any, Protocol

from gclm.compiler import TokenVocabulary
from gclm.errors import InvalidRequestError
from gclm.masking.state import ConstraintState
from gclm.server.engine.chat_template import encode_chat, render_chat, renders_tools
from gclm.server.engine.constraints import Constraints
from gclm.server.engine.logprobs import TokenNames
from gclm.server.engine.protocol import (
    EngineStats,
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    StreamEvent,
)


def out_of_budget(state: ConstraintState | None) -> tuple[str, bool]:
    """The finish_reason and budget_cut of an output whose budget ran out, one rule for
    both engines: "stop" where the constrained output is complete (the budget ran out
    exactly at its end), else "length"; cut unless the constraint allowed nothing more."""
    if state is None:
        return "length", True
    return ("stop" if state.is_accepting else "length"), state.masks.has_tokens(state.state)


class QueuedHandle(Protocol):
    """A handle whose events the engine puts on a queue (both real engines' handles)."""

    request_id: str
    events: asyncio.Queue[StreamEvent]


async def until_done(events: asyncio.Queue[StreamEvent]) -> AsyncIterator[StreamEvent]:
    """A request's events from its queue, ending with its FinishEvent or ErrorEvent."""
    while True:
        event = await events.get()
        yield event
        if isinstance(event, FinishEvent | ErrorEvent):
            return


class TokenizerPrompts:
    """Implements gclm.server.engine.protocol.Prompts with a Hugging Face tokenizer and its
    chat template, refusing (400) a text longer than the model's context could hold before
    tokenizing it.

    Args:
        tokenizer: the served model's tokenizer.
        vocab: its vocabulary (the longest token bounds a token's characters).
        context_length: the model's context in tokens, asked each time (vLLM's is known
            once started).
    """

    def __init__(
        self, tokenizer: Any, vocab: TokenVocabulary, context_length: Callable[[], int]
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.context_length = context_length

    def encode_prompt(self, prompt: str) -> list[int]:
        self._check_chars(len(prompt), "prompt")
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        self._check_chars(sum(len(str(m.get("content", ""))) for m in messages), "messages")
        return render_chat(self.tokenizer, messages, **template_kwargs)

    def encode_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
        """The prompt ids of `messages` (`template_kwargs` go to the chat template, e.g.
        enable_thinking); control-token text inside them stays plain text."""
        self._check_chars(sum(len(str(m.get("content", ""))) for m in messages), "messages")
        return encode_chat(self.tokenizer, messages, **template_kwargs)

    @cached_property
    def renders_tools(self) -> bool:
        return renders_tools(self.tokenizer)

    @cached_property
    def _longest_token(self) -> int:
        return max((len(b) for b in self.vocab.token_bytes if b), default=1)

    @property
    def max_prompt_chars(self) -> int:
        """No token spells more than `_longest_token` bytes (nor characters), so a text
        longer than this has more tokens than the context holds: refused before it is
        tokenized."""
        return self.context_length() * self._longest_token

    def _check_chars(self, chars: int, param: str) -> None:
        if chars > self.max_prompt_chars:
            raise InvalidRequestError(
                f"The {param} has {chars:,} characters, more than fit in the model's context "
                f"of {self.context_length()} tokens. Shorten it.",
                param=param,
                code="context_length_exceeded",
            )


class TokenizerEngine:
    """The Engine methods both real engines share; each sets these attributes itself.

    `context_length` is the model's context in tokens (vLLM's is known once started).
    """

    tokenizer: Any
    vocab: TokenVocabulary
    prompts: TokenizerPrompts
    constraints: Constraints  # tables, compiles, mask rows, budget policies
    context_length: int

    def stream(self, handle: QueuedHandle) -> AsyncIterator[StreamEvent]:
        return until_done(handle.events)

    @cached_property
    def token_names(self) -> TokenNames:
        """Each token id's text and bytes, as logprobs show them."""
        return TokenNames(self.vocab.token_bytes, self.tokenizer.convert_ids_to_tokens)

    def check_admissible(self, request: GenerationRequest) -> None:
        """Refuse (400) a request no engine could serve: an empty prompt, a token id outside
        the vocabulary, a prompt plus max_tokens past the context. (A budget below the
        constraint's minimum was refused where the constraint was prepared:
        server/engine/prepare.py.)"""
        ids, size, max_tokens = request.prompt_ids, self.vocab.size, request.params.max_tokens
        if not ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if len(ids) + max_tokens > self.context_length:
            raise InvalidRequestError(
                f"The prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
                f"model's context of {self.context_length} tokens. Shorten the prompt or "
                "lower max_tokens.",
                param="max_tokens",
            )
        if max(ids) >= size or min(ids) < 0:
            raise InvalidRequestError(f"Prompt token ids must be in [0, {size}).", param="prompt")
        for token, _ in request.params.logit_bias:
            if not 0 <= token < size:
                raise InvalidRequestError(
                    f"logit_bias names token {token}; token ids are in [0, {size}).",
                    param="logit_bias",
                )

    def engine_stats(
        self,
        *,
        queue_depth: int,
        batch_size: int,
        batch_slots: int,
        counters: Mapping[str, float] | None = None,
    ) -> EngineStats:
        """This engine's stats, with the table cache and compile pool read the same way for
        every engine: a hit is a constraint served without compiling (from memory, from
        disk, or a remembered failure), a miss one that was compiled."""
        s = self.constraints.cache.stats
        gauges: dict[str, float] = dict(counters or {})
        gauges.update(self.constraints.gauges())
        return EngineStats(
            queue_depth=queue_depth,
            batch_size=batch_size,
            batch_slots=batch_slots,
            cache_hits=s.hits + s.negative_hits + s.disk_hits,
            cache_misses=s.misses - s.disk_hits,
            gauges=gauges,
        )
