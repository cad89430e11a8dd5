"""The running batch's KV cache: one left-padded DynamicCache, rows merged and selected.

Row b holds `lengths[b]` real tokens, right-aligned; `attention[b]` is 1 on them and 0 on
the padding to their left. A prompt is prefilled on its own batch, then merged in by
left-padding whichever side is shorter; finished rows are dropped with an index select, and
padding columns no row needs any more are trimmed.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache


@lru_cache(maxsize=16)
def _cache_kwarg(model_type: type) -> str:
    """The name forward() takes the KV cache under: transformers 5.24 renamed
    `past_key_values` to `cache` (the old name warns, and is due to go in 5.40)."""
    try:
        params = inspect.signature(model_type.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _forward(model: Any, cache: DynamicCache, **inputs: Any) -> Any:
    """One forward pass that updates `cache` in place (a DynamicCache grows where it is)."""
    inputs[_cache_kwarg(type(model))] = cache
    return model(**inputs, use_cache=True, logits_to_keep=1)


class KVBatch:
    def __init__(
        self,
        cache: DynamicCache | None = None,
        attention: torch.Tensor | None = None,  # long [B, T]
        lengths: torch.Tensor | None = None,  # long [B]
    ):
        self.cache = cache
        self.attention = attention
        self.lengths = lengths

    @property
    def size(self) -> int:
        return 0 if self.attention is None else int(self.attention.shape[0])

    @classmethod
    def prefill(
        cls, model: Any, prompts: list[list[int]], device: torch.device
    ) -> tuple[KVBatch, torch.Tensor]:
        """Run the prompts, left-padded, through the model. Returns the batch and the
        last position's logits [B, V]."""
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :] = torch.tensor(p)
            attention[b, width - len(p) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = _forward(
            model,
            cache,
            input_ids=ids.to(device),
            attention_mask=attention.to(device),
            position_ids=positions.to(device),
        )
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        return cls(cache, attention.to(device), lengths.to(device)), out.logits[:, -1]

    def decode(self, model: Any, last_tokens: list[int], device: torch.device) -> torch.Tensor:
        """Feed each row its last sampled token; returns next-token logits [B, V]."""
        assert self.attention is not None and self.lengths is not None
        ones = torch.ones((self.size, 1), dtype=torch.long, device=device)
        self.attention = torch.cat([self.attention, ones], dim=1)  # [B, T+1]
        assert self.cache is not None
        out = _forward(
            model,
            self.cache,
            input_ids=torch.tensor(last_tokens, device=device)[:, None],
            attention_mask=self.attention,
            position_ids=self.lengths[:, None],
        )
        self.lengths = self.lengths + 1
        return out.logits[:, -1]

    def merge(self, other: KVBatch) -> KVBatch:
        """This batch's rows, then `other`'s, padded on the left to one width."""
        if self.size == 0:
            return other
        assert self.cache is not None and other.cache is not None
        assert self.attention is not None and other.attention is not None
        width = max(self.attention.shape[1], other.attention.shape[1])

        def pad(t: torch.Tensor, dim_from_end: int) -> torch.Tensor:
            missing = width - t.shape[-dim_from_end]
            if missing == 0:
                return t
            spec = [0, 0] * (dim_from_end - 1) + [missing, 0]
            return F.pad(t, spec)

        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)])  # [B, H, T, D]
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)])
        attention = torch.cat([pad(self.attention, 1), pad(other.attention, 1)])
        lengths = torch.cat([self.lengths, other.lengths])  # type: ignore[list-item]
        return KVBatch(self.cache, attention, lengths)

    def select(self, keep: list[int]) -> KVBatch:
        """Only the rows `keep`, in that order, without padding columns none of them uses."""
        if not keep:
            return KVBatch()
        assert self.cache is not None and self.attention is not None
        index = torch.tensor(keep, device=self.attention.device)
        attention = self.attention.index_select(0, index)
        first = int(torch.nonzero(attention.any(dim=0))[0])
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        return KVBatch(self.cache, attention[:, first:], self.lengths.index_select(0, index))  # type: ignore[union-attr]
