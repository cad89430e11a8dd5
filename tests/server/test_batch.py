"""KVBatch on a tiny random Llama: prefilled, left-padded, merged and selected rows give the
logits of a plain forward pass over each row's own tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gclm.server.batch import KVBatch

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def plain(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    """Next-token logits [V] of one unpadded sequence, without a cache."""
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


@torch.no_grad()
def test_rows_match_a_plain_forward_pass(model):
    rows = [[1, 2, 3, 4, 5], [6, 7]]
    batch, logits = KVBatch.prefill(model, rows, CPU)
    for i, tokens in enumerate(rows):
        torch.testing.assert_close(logits[i], plain(model, tokens))

    # A longer prompt joins: the running rows are padded further on the left.
    joining, _ = KVBatch.prefill(model, [[8, 9, 10, 11, 12, 13, 14]], CPU)
    batch = batch.merge(joining)
    rows.append([8, 9, 10, 11, 12, 13, 14])
    for step in range(2):
        last = [20 + 3 * step + i for i in range(len(rows))]
        logits = batch.decode(model, last, CPU)
        for i, token in enumerate(last):
            rows[i].append(token)
            torch.testing.assert_close(logits[i], plain(model, rows[i]))

    # The longest row finishes: its padding columns are trimmed from the others.
    batch = batch.select([1, 0])
    rows = [rows[1], rows[0]]
    assert batch.attention.shape[1] == max(len(r) for r in rows)
    logits = batch.decode(model, [30, 31], CPU)
    for i, token in enumerate([30, 31]):
        rows[i].append(token)
        torch.testing.assert_close(logits[i], plain(model, rows[i]))
    assert batch.select([]).size == 0
