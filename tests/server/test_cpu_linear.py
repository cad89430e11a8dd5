"""pack_linears: a bfloat16 model on the CPU gives the same logits with prepacked weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from gclm.server.cpu_linear import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)


def tiny(dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval().to(dtype)


@torch.no_grad()
def test_packed_bfloat16_model_gives_the_same_logits():
    plain, packed = tiny(torch.bfloat16), tiny(torch.bfloat16)
    # 4 projections + 3 MLP matrices per layer, and the head.
    assert pack_linears(packed) == 2 * 7 + 1
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert isinstance(packed.lm_head, PackedLinear)
    ids = torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 1, 0]])
    expected = plain(input_ids=ids).logits
    torch.testing.assert_close(packed(input_ids=ids).logits, expected, rtol=1e-2, atol=1e-2)


def test_float32_models_are_left_alone():
    model = tiny(torch.float32)
    assert pack_linears(model) == 0
    assert type(model.lm_head) is nn.Linear
