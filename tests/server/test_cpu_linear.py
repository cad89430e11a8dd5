"""pack_linears: a bfloat16 model on the CPU gives the same logits, to the bit, with
prepacked weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gclm.server.engine.model_loader import cpu_has_bf16
from gclm.server.engine.transformers.cpu_linear import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)
# oneDNN's bf16 reorder needs AVX512 (BW/VL/DQ) or AVX-NE-CONVERT; elsewhere packing is off.
needs_bf16_cpu = pytest.mark.skipif(
    not cpu_has_bf16(), reason="this CPU has no bfloat16 instructions: pack_linears packs nothing"
)


@needs_bf16_cpu
@torch.no_grad()
def test_packed_bfloat16_model_gives_the_same_logits(tiny_llama):
    plain = tiny_llama(vocab_size=64).to(torch.bfloat16)
    packed = tiny_llama(vocab_size=64).to(torch.bfloat16)
    # 4 projections + 3 MLP matrices per layer, and the head.
    assert pack_linears(packed) == 2 * 7 + 1
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert isinstance(packed.lm_head, PackedLinear)
    ids = torch.tensor([[1, 5, 9, 2, 7], [3, 3, 8, 1, 0]])
    expected = plain(input_ids=ids).logits
    assert torch.equal(packed(input_ids=ids).logits, expected)


def test_float32_models_are_left_alone(tiny_llama):
    model = tiny_llama(vocab_size=64)
    assert pack_linears(model) == 0
    assert type(model.lm_head) is nn.Linear
