"""Log-probabilities of the sampled tokens, read from the distribution after the mask.

The transformers engine computes them here (`token_logprobs`) from logits that have been
penalised, biased and masked (constraint and budget), so a token the constraint forbids has
probability 0 and never appears among the top tokens. As in vLLM, SGLang and TGI,
temperature and top_p are not applied: the values are those of the masked distribution at
temperature 1. The vLLM engine reads vLLM's own (`from_vllm`), which it asks for after the
logits processors (`logprobs_mode="processed_logprobs"`): masked the same way, but for a
sampled request after temperature and top_p too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from collections.abc import Sequence as Seq
from functools import lru_cache
from typing import Any, Protocol

import torch

from gclm.server.engine.protocol import GenerationRequest, TokenLogprob


class _Row(Protocol):
    request: GenerationRequest


class TokenNames:
    """A token id's text and bytes, as OpenAI's logprobs show them."""

    def __init__(self, token_bytes: Seq[bytes | None], name: Callable[[int], str]) -> None:
        """`token_bytes[i]`: the token's bytes (None for special tokens, named by `name`)."""
        self._bytes = token_bytes
        self._name = name
        self.describe = lru_cache(maxsize=1 << 16)(self._describe)

    def _describe(self, token_id: int) -> tuple[str, bytes | None]:
        data = self._bytes[token_id] if 0 <= token_id < len(self._bytes) else None
        if data is None:
            return self._name(token_id), None
        return token_text(data), data


def token_text(data: bytes) -> str:
    """The token's text, or OpenAI's "bytes:\\xe4\\xb8" when it is not whole UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def token_logprobs(
    logits: torch.Tensor, tokens: Seq[int], rows: Seq[_Row], names: TokenNames
) -> list[TokenLogprob | None]:
    """The logprob of tokens[i] under logits [B, V] (masked), with rows[i]'s top k.

    None for the rows that did not ask for logprobs. Top tokens are sorted by logprob and
    never include a masked token (-inf), so a row may get fewer than k of them.
    """
    out: list[TokenLogprob | None] = [None] * len(rows)
    picked = [i for i, r in enumerate(rows) if r.request.params.logprobs is not None]
    if not picked:
        return out
    device = logits.device
    lp = torch.log_softmax(logits[picked], dim=-1)  # [P, V]
    chosen = torch.tensor([tokens[i] for i in picked], device=device)  # [P]
    chosen_lp = lp.gather(1, chosen[:, None]).squeeze(1).tolist()  # [P]
    k = min(max(rows[i].request.params.logprobs or 0 for i in picked), lp.shape[1])
    top_lp, top_ids = lp.topk(k, dim=-1)  # [P, k] each
    top_lp, top_ids = top_lp.tolist(), top_ids.tolist()
    for j, i in enumerate(picked):
        want = rows[i].request.params.logprobs or 0
        top = tuple(
            TokenLogprob(*names.describe(t), logprob=v)
            for t, v in zip(top_ids[j][:want], top_lp[j][:want], strict=True)
            if v != float("-inf")
        )
        out[i] = TokenLogprob(*names.describe(tokens[i]), logprob=chosen_lp[j], top=top)
    return out


def from_vllm(
    token_ids: Seq[int], positions: Seq[Mapping[int, Any] | None], names: TokenNames, k: int
) -> tuple[TokenLogprob, ...]:
    """One TokenLogprob per token of a vLLM output delta.

    Args:
        token_ids: the delta's sampled tokens.
        positions: vLLM's logprobs for them: per token, {token id: Logprob(logprob, rank)}
            holding the sampled token and the `k` best ranked.
        names: the engine's token names.
        k: the top tokens the request asked for.
    Top tokens are sorted by rank and never include a masked token (-inf), as in
    `token_logprobs`.
    """
    out = []
    for token, entries in zip(token_ids, positions, strict=True):
        entries = entries or {}
        chosen = entries.get(token)
        ranked = sorted(
            (e.rank, t, e.logprob)
            for t, e in entries.items()
            if e.rank is not None and e.rank <= k and not math.isinf(e.logprob)
        )
        top = tuple(TokenLogprob(*names.describe(t), logprob=v) for _, t, v in ranked)
        value = chosen.logprob if chosen is not None else -math.inf
        out.append(TokenLogprob(*names.describe(token), logprob=value, top=top))
    return tuple(out)
