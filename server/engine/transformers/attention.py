"""The engine's attention on the CPU: float32 matmuls in place of torch's flash kernel.

torch's CPU flash kernel (SDPA) spends most of its time outside its matmuls. On 2 cores
(AVX512-BF16, no AMX, one intra-op thread) it ran a prompt's attention for the embedded
model at 40-80 GFLOP/s, no faster in bfloat16 than in float32, and a bfloat16 decode
step's attention 5-9x slower than in float32 (one small oneDNN call per head and block).
Both paths here widen bfloat16 keys and values to float32 (exactly) and compute the scores,
their softmax and the weighted values in float32, rounding once at the end: the outputs
are SDPA's up to float32 rounding (the flash kernel rounds the softmax's weights to
bfloat16 too; tests/server/test_attention.py).

- `causal_attention`, a prompt's chunk (one row, its queries the last positions of its
  keys): a block of queries at a time per key/value head, against only the keys up to the
  block's last position, as two oneDNN matmuls around one softmax. The query heads that
  share a key/value head are rows of one matrix (no copy of the keys per head), and the
  causal mask touches only the block's diagonal square. float32 `torch.mm` would take MKL,
  whose AVX2 path on this AMD CPU runs at ~100 GFLOP/s against oneDNN's ~240.
- `masked_attention`, a few queries a row (decode steps, drafts) over an additive mask: two
  batched matmuls over every row and key/value head at once; bfloat16 only (in float32
  SDPA is as fast).

The engine switches a CPU model that attends with SDPA to `ATTENTION` (`use_on`): each pass
runs one of the two where it applies (a prompt's chunk says so: `gclm_prompt=True`), and
transformers' SDPA function otherwise. bench/attention.py measures them against SDPA.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

# The name the attention function is registered under.
ATTENTION = "gclm_cpu"
# Queries per block of a prompt: 128 measured fastest at 1k-4k keys (64 and 256 slower).
BLOCK = 128
# A prompt's chunk with fewer queries runs `masked_attention` (or SDPA in float32).
MIN_QUERIES = 16
# Bytes of float32 temporaries one matmul may make: a prompt's block of scores, a step's
# widened keys and values (at long contexts, fewer queries a block or rows at a time).
TEMP_BYTES = 16 << 20
# Attention kwargs that change the result; a pass that sets one runs SDPA.
_UNSUPPORTED = ("softcap", "sliding_window", "s_aux", "position_bias")

# float32 prompts take the blocked path only where it was measured faster than SDPA: on
# AVX512 (2.0-2.2x one layer's attention, AVX512-BF16). On an AVX2 CPU (AMD EPYC, 2 cores,
# one thread) it was slower: one layer 0.83-0.99x SDPA's speed at 1k-4k tokens, the
# embedded model's float32 prefill 0.94x / 0.87x / 0.81x at 1k / 2k / 4k (bench/attention.py).
FLOAT32_BLOCKED = torch.backends.cpu.get_cpu_capability().startswith("AVX512")

_linear = torch.ops.mkldnn._linear_pointwise  # oneDNN: x [M, K] @ w[N, K]^T -> [M, N]


def _plain(
    module: Any, query: torch.Tensor, key: torch.Tensor, dropout: float, kwargs: Any
) -> bool:
    """Whether a call is plain attention the paths here compute: on the CPU, bfloat16 or
    float32, query heads a multiple of the key heads, a causal layer with no dropout,
    soft cap, sliding window or sinks."""
    return (
        query.device.type == "cpu"
        and query.dtype in (torch.bfloat16, torch.float32)
        and query.shape[1] % key.shape[1] == 0
        and dropout == 0.0
        and getattr(module, "is_causal", True)
        and all(kwargs.get(name) is None for name in _UNSUPPORTED)
    )


def runs(module: Any, query: torch.Tensor, key: torch.Tensor, dropout: float, kwargs: Any) -> bool:
    """Whether `causal_attention` computes this prompt chunk's call: plain, one row, at
    least MIN_QUERIES queries, oneDNN present, bfloat16 or (FLOAT32_BLOCKED) float32."""
    return (
        _plain(module, query, key, dropout, kwargs)
        and (query.dtype == torch.bfloat16 or FLOAT32_BLOCKED)
        and query.shape[0] == 1
        and key.shape[0] == 1
        and MIN_QUERIES <= query.shape[2] <= key.shape[2]
        and torch.backends.mkldnn.is_available()
    )


def runs_masked(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    dropout: float,
    kwargs: Any,
) -> bool:
    """Whether `masked_attention` computes this call: plain, bfloat16, fewer than
    MIN_QUERIES queries a row, and a mask [B, 1, q, W] (or none for one query)."""
    if not _plain(module, query, key, dropout, kwargs) or query.dtype != torch.bfloat16:
        return False
    batch, _, length, _ = query.shape
    if length >= MIN_QUERIES or key.shape[0] != batch:
        return False
    if mask is None:
        return length == 1
    return mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2:] == (length, key.shape[2])


def causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None = None,
    block: int = BLOCK,
) -> torch.Tensor:
    """Attention of `query` [1, H, T, D], the last T positions of one sequence, over its
    keys and values [1, KV, W, D] (W >= T; query i sees keys 0..W-T+i); returns
    [1, T, H, D] in the query's dtype, as transformers' attention functions do."""
    _, heads, length, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    start = width - length
    scale = dim**-0.5 if scaling is None else scaling
    # Rows (position, head of the group) of one matrix per key/value head: [KV, T, G, D].
    q = torch.empty((kv_heads, length, groups, dim), dtype=torch.float32)
    q.copy_(query[0].view(kv_heads, groups, length, dim).transpose(1, 2))
    q.mul_(scale)
    k = key[0].to(torch.float32)  # [KV, W, D], each head's rows contiguous
    vt = torch.empty((kv_heads, dim, width), dtype=torch.float32)
    vt.copy_(value[0].transpose(1, 2))  # [KV, D, W]
    out = query.new_empty((length, kv_heads, groups, dim))  # [T, KV, G, D] = [T, H, D]
    block = max(MIN_QUERIES, min(block, TEMP_BYTES // (4 * groups * width)))
    above = torch.full((block, block), float("-inf")).triu_(1)[:, None, :]  # [n, 1, n]
    for b0 in range(0, length, block):
        n = min(block, length - b0)
        end = start + b0 + n  # the block sees keys [0, end)
        for h in range(kv_heads):
            rows = q[h, b0 : b0 + n].view(n * groups, dim)
            scores = _linear(rows, k[h, :end], None, "none", [], "")  # [nG, end]
            scores.view(n, groups, end)[:, :, end - n :].add_(above[:n, :, :n])
            torch.ops.aten._softmax.out(scores, -1, False, out=scores)
            # oneDNN's matmul takes a strided weight on a slow reference path: copy it.
            values = vt[h, :, :end].contiguous()  # [D, end]
            weighted = _linear(scores, values, None, "none", [], "")  # [nG, D]
            out[b0 : b0 + n, h] = weighted.view(n, groups, dim)
    return out.view(1, length, heads, dim)


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of `query` [B, H, q, D] over `key`/`value` [B, KV, W, D] under the
    additive `mask` [B, 1, q, W] (None: every key visible); returns [B, q, H, D] in the
    query's dtype."""
    batch, heads, length, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    out = query.new_empty((batch, length, kv_heads, groups, dim))
    rows = max(1, TEMP_BYTES // (2 * 4 * kv_heads * width * dim))  # widened keys and values
    for r0 in range(0, batch, rows):
        r1 = min(batch, r0 + rows)
        n = r1 - r0
        q = query[r0:r1].reshape(n, kv_heads, groups * length, dim).to(torch.float32) * scale
        scores = torch.matmul(q, key[r0:r1].to(torch.float32).transpose(-1, -2))  # [n, KV, Gq, W]
        if mask is not None:
            scores.view(n, kv_heads, groups, length, width).add_(mask[r0:r1, :, None])
        torch.ops.aten._softmax.out(scores, -1, False, out=scores)
        weighted = torch.matmul(scores, value[r0:r1].to(torch.float32))  # [n, KV, G*q, D]
        out[r0:r1] = weighted.view(n, kv_heads, groups, length, dim).permute(0, 3, 1, 2, 4)
    return out.view(batch, length, heads, dim)


def cpu_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    gclm_prompt: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function registered as ATTENTION: a prompt's chunk (`gclm_prompt`)
    through `causal_attention`, a few queries a row through `masked_attention`, where
    they apply; transformers' SDPA otherwise."""
    if gclm_prompt and runs(module, query, key, dropout, kwargs):
        return causal_attention(query, key, value, scaling), None
    if runs_masked(module, query, key, attention_mask, dropout, kwargs):
        return masked_attention(query, key, value, attention_mask, scaling), None
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


AttentionInterface.register(ATTENTION, cpu_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def use_on(model: Any) -> bool:
    """Switch a CPU model that attends with SDPA to `cpu_attention`; whether it runs it."""
    text_config = getattr(model.config, "text_config", None) or model.config
    device = next(model.parameters()).device
    if device.type == "cpu" and getattr(text_config, "_attn_implementation", None) == "sdpa":
        text_config._attn_implementation = ATTENTION
    return getattr(text_config, "_attn_implementation", None) == ATTENTION
