"""Logprobs of a batch: values from the masked distribution, top tokens, names and bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from gclm.server.engine.logprobs import TokenNames, from_vllm, token_logprobs, token_text
from gclm.server.engine.protocol import GenerationRequest, SamplingParams, TokenLogprob
from gclm.server.openai.completions.render import CompletionLogprobs

INF = float("inf")
NAMES = TokenNames([b"a", b"b", "é".encode()[:1], None, "é".encode()], lambda i: f"<special{i}>")


@dataclass
class Row:
    request: GenerationRequest


def row(logprobs: int | None) -> Row:
    params = SamplingParams(max_tokens=4, logprobs=logprobs)
    return Row(GenerationRequest(prompt_ids=[0], params=params))


def test_values_come_from_the_masked_distribution() -> None:
    logits = torch.tensor([[1.0, 2.0, -INF, 0.5, -INF]])
    [lp] = token_logprobs(logits, [1], [row(5)], NAMES)
    assert lp is not None
    expected = torch.log_softmax(logits, dim=-1)[0]
    assert math.isclose(lp.logprob, expected[1].item(), rel_tol=1e-6)
    # Masked tokens (-inf) never appear, even when more are asked for than are allowed.
    assert [t.token for t in lp.top] == ["b", "a", "<special3>"]
    assert math.isclose(sum(math.exp(t.logprob) for t in lp.top), 1.0, rel_tol=1e-6)
    assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)


def test_rows_get_their_own_k_or_none() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.0, 0.0, 0.0]] * 3)
    lps = token_logprobs(logits, [0, 1, 2], [row(None), row(0), row(2)], NAMES)
    assert lps[0] is None
    assert lps[1] is not None and lps[1].top == () and lps[1].token == "b"
    assert lps[2] is not None and [t.token for t in lps[2].top] == ["b", "a"]


def test_no_row_asks() -> None:
    assert token_logprobs(torch.zeros(2, 5), [0, 1], [row(None), row(None)], NAMES) == [
        None,
        None,
    ]


def test_token_names_and_bytes() -> None:
    assert NAMES.describe(0) == ("a", b"a")
    assert NAMES.describe(2) == ("bytes:\\xc3", b"\xc3")
    assert NAMES.describe(3) == ("<special3>", None)
    assert NAMES.describe(4) == ("é", "é".encode())
    assert token_text(b"\xf0\x9f") == "bytes:\\xf0\\x9f"


def test_completion_text_offsets_count_characters() -> None:
    tokens = [("a", b"a"), ("bytes:\\xc3", b"\xc3"), ("bytes:\\xa9", b"\xa9"), ("b", b"b")]
    body = CompletionLogprobs.of([TokenLogprob(t, b, -1.0) for t, b in tokens], start=2)
    assert body.text_offset == [2, 3, 3, 4]
    assert body.tokens == [t for t, _ in tokens]


def test_vllm_logprobs_become_the_same_token_logprobs() -> None:
    """vLLM gives, per token, the sampled token and the k best ranked ({id: Logprob}); a
    masked token (-inf, as vLLM ranks it past the allowed ones) is left out of the top."""

    def lp(value: float, rank: int) -> SimpleNamespace:
        return SimpleNamespace(logprob=value, rank=rank, decoded_token="?")

    positions = [
        {1: lp(-0.2, 1), 0: lp(-1.7, 2)},  # the sampled token is the best
        {4: lp(-3.0, 3), 0: lp(-0.1, 1), 3: lp(-2.5, 2)},  # sampled outside the top 2
        {2: lp(0.0, 1), 1: lp(-INF, 2)},  # one token allowed: the rest is masked
    ]
    first, second, third = from_vllm([1, 4, 2], positions, NAMES, 2)
    assert (first.token, first.logprob) == ("b", -0.2)
    assert [(t.token, t.logprob) for t in first.top] == [("b", -0.2), ("a", -1.7)]
    assert (second.token, second.bytes, second.logprob) == ("é", "é".encode(), -3.0)
    assert [t.token for t in second.top] == ["a", "<special3>"]
    assert third.token == "bytes:\\xc3" and [t.token for t in third.top] == ["bytes:\\xc3"]
    assert from_vllm([1], [None], NAMES, 0)[0].logprob == -INF  # nothing given: impossible
