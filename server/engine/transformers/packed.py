"""One forward pass over several sequences packed into one row: decodes beside a prompt chunk.

A step that decodes the running rows and prefills a chunk of a long prompt can run as two
passes (every weight read twice, and the decode pass's whole cost paid again at every step
of the prompt) or as one rectangle pass (every decode row padded to the chunk's length).
On a CPU both cost a large share of a step that should stay under a second. Packed, the
linear layers see one row holding every sequence's new tokens, and attention runs per
sequence, over views of its own slot's keys in the KV store (nothing copied), with the
causal mask offset by what the slot already holds.

The per-sequence attention is an attention function registered with transformers
(`ATTENTION`); `packed_attention_on` switches the model's text config to it for one pass
and back, so every other pass runs the model's own implementation, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, use_gqa_in_sdpa

from gclm.server.engine.transformers.attention import ATTENTION as CPU_ATTENTION
from gclm.server.engine.transformers.attention import (
    causal_attention,
    masked_attention,
    runs,
    runs_masked,
)

# The name the per-sequence attention is registered under.
ATTENTION = "gclm_packed"


@dataclass(frozen=True)
class Segment:
    """One sequence's new tokens in a packed row: `length` tokens from index `offset` of the
    row, at positions `start..start+length-1` of KV slot `slot`; `mask` the additive mask
    over its `start + length` keys where it needs one (several tokens after the first
    chunk: each sees the keys up to its own), built once for every layer of the pass."""

    slot: int
    offset: int
    length: int
    start: int
    mask: torch.Tensor | None = None

    @classmethod
    def of(cls, slot: int, offset: int, length: int, start: int, dtype: torch.dtype) -> Segment:
        """The segment, with its mask when it needs one."""
        mask = None
        if length > 1 and start > 0:
            width = start + length
            visible = torch.arange(width)[None, :] <= start + torch.arange(length)[:, None]
            mask = torch.zeros(visible.shape, dtype=dtype)
            mask.masked_fill_(~visible, torch.finfo(dtype).min)
        return cls(slot, offset, length, start, mask)


def packed_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    gclm_segments: tuple[Segment, ...] = (),
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention for a packed row: `query` [1, heads, T, D]; `key`/`value` the store's whole
    buffers [slots, kv_heads, capacity, D], this pass's keys already written. Each segment's
    queries attend to its slot's positions up to their own, through attention.py's paths
    where they apply (a prompt's chunk, a few decoded tokens in bfloat16), else SDPA.
    Returns [1, T, heads, D]."""
    groups = getattr(module, "num_key_value_groups", 1)
    outputs = []
    for seg in gclm_segments:
        q = query[:, :, seg.offset : seg.offset + seg.length]
        width = seg.start + seg.length
        k = key[seg.slot : seg.slot + 1, :, :width]
        v = value[seg.slot : seg.slot + 1, :, :width]
        mask = seg.mask
        if runs(module, q, k, dropout, kwargs):
            outputs.append(causal_attention(q, k, v, scaling).transpose(1, 2))
            continue
        mask4 = None if mask is None else mask[None, None]
        if runs_masked(module, q, k, mask4, dropout, kwargs):
            outputs.append(masked_attention(q, k, v, mask4, scaling).transpose(1, 2))
            continue
        causal = seg.length > 1 and seg.start == 0  # a prompt's first chunk: SDPA's own kernel
        extra = {}
        if groups > 1:
            if use_gqa_in_sdpa(mask, k, v):
                extra["enable_gqa"] = True
            else:
                k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        outputs.append(
            F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, is_causal=causal, **extra
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, packed_attention)


def can_pack(text_config: Any, device: torch.device) -> bool:
    """Whether a model runs packed passes: on the CPU (on a GPU, one kernel launch per
    sequence and layer costs more than the second pass it saves), where it attends with
    SDPA (the function here is SDPA per sequence), or attention.py's."""
    attention = getattr(text_config, "_attn_implementation", None)
    return device.type == "cpu" and attention in ("sdpa", CPU_ATTENTION)


@contextmanager
def packed_attention_on(text_config: Any) -> Iterator[None]:
    """Run the model's attention layers on `packed_attention` for the passes inside."""
    before = text_config._attn_implementation
    text_config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        text_config._attn_implementation = before
