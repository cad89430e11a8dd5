"""attention.py against SDPA: on random inputs, its outputs are as close to a float64
reference as SDPA's own (causal with an offset, shared key/value heads, lengths that are no
multiple of the block); in the KV store, a model switched to it gives a plain forward's
logits."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import gclm.server.engine.transformers.attention as attention
import gclm.server.engine.transformers.packed as packed
from gclm.server.engine.transformers.attention import (
    ATTENTION,
    causal_attention,
    cpu_attention,
    masked_attention,
    use_on,
)
from gclm.server.engine.transformers.kv_store import KVStore

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN"
)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """SDPA in float64 under a boolean mask [B, 1, q, W], as [B, q, H, D]."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(groups, 1) for t in (k, v))
    return F.scaled_dot_product_attention(q.double(), k, v, attn_mask=mask).transpose(1, 2)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SDPA in the inputs' dtype under an additive mask, as the engine ran it."""
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=additive, enable_gqa=True).transpose(
        1, 2
    )


def offset_causal(length: int, width: int) -> torch.Tensor:
    """[1, 1, length, width]: query i sees keys 0..width-length+i."""
    return (torch.arange(width)[None, :] <= width - length + torch.arange(length)[:, None])[
        None, None
    ]


def no_worse_than_sdpa(got: torch.Tensor, sdpa_out: torch.Tensor, expected: torch.Tensor) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
        return
    error = (got.double() - expected).abs()
    sdpa_error = (sdpa_out.double() - expected).abs()
    # bfloat16: one rounding of the output, as SDPA's
    assert float(error.mean()) <= 1.1 * float(sdpa_error.mean())
    assert float(error.max()) <= 1.1 * float(sdpa_error.max()) + 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize(
    ("length", "start", "block"), [(16, 0, 128), (50, 0, 16), (130, 0, 128), (77, 200, 32)]
)
def test_causal_attention_is_sdpa_within_its_rounding(dtype, groups, length, start, block):
    torch.manual_seed(length + start)
    width = start + length
    q = torch.randn(1, 2 * groups, length, 16, dtype=dtype) * 3  # peaked weights
    k = torch.randn(1, 2, width, 16, dtype=dtype)
    v = torch.randn(1, 2, width, 16, dtype=dtype)
    mask = offset_causal(length, width)
    got = causal_attention(q, k, v, block=block)
    assert got.shape == (1, length, 2 * groups, 16) and got.dtype == dtype
    no_worse_than_sdpa(got, sdpa(q, k, v, mask), reference(q, k, v, mask))


def test_long_keys_take_fewer_queries_a_block(monkeypatch):
    """Past the temporaries' budget a block holds MIN_QUERIES queries: the same outputs."""
    torch.manual_seed(1)
    q = torch.randn(1, 6, 70, 16)
    k, v = torch.randn(1, 2, 90, 16), torch.randn(1, 2, 90, 16)
    expected = causal_attention(q, k, v)
    monkeypatch.setattr(attention, "TEMP_BYTES", 1)
    torch.testing.assert_close(causal_attention(q, k, v), expected)


@pytest.mark.parametrize("length", [1, 3])
@pytest.mark.parametrize("temp_bytes", [None, 1])
def test_masked_attention_is_sdpa_within_its_rounding(monkeypatch, length, temp_bytes):
    """Rows of a decode step: keys visible up to each row's own length (all rows at once,
    or, past the temporaries' budget, one at a time)."""
    if temp_bytes is not None:
        monkeypatch.setattr(attention, "TEMP_BYTES", temp_bytes)
    torch.manual_seed(length)
    q = torch.randn(4, 6, length, 16, dtype=torch.bfloat16) * 3
    k = torch.randn(4, 2, 70, 16, dtype=torch.bfloat16)
    v = torch.randn(4, 2, 70, 16, dtype=torch.bfloat16)
    ends = torch.tensor([70, 12, 40, 3])
    mask = (
        torch.arange(70)[None, None, :]
        < ends[:, None, None] + torch.arange(length)[None, :, None] - length + 1
    )
    mask = mask[:, None]  # [4, 1, q, 70]
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill_(~mask, torch.finfo(q.dtype).min)
    got = masked_attention(q, k, v, additive)
    assert got.shape == (4, length, 6, 16)
    no_worse_than_sdpa(got, sdpa(q, k, v, mask), reference(q, k, v, mask))


class _Layer(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def test_float32_decode_and_unknown_options_run_sdpa():
    """A float32 decode step, and a call with an option the paths here lack (a soft cap),
    get transformers' SDPA function's result, to the bit."""
    torch.manual_seed(0)
    q = torch.randn(2, 6, 1, 16)
    k, v = torch.randn(2, 2, 20, 16), torch.randn(2, 2, 20, 16)
    mask = torch.zeros(2, 1, 1, 20)
    mask[1, :, :, 10:] = torch.finfo(torch.float32).min
    expected, _ = sdpa_attention_forward(_Layer(), q, k, v, mask)
    assert torch.equal(cpu_attention(_Layer(), q, k, v, mask)[0], expected)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    long_q = torch.randn(1, 6, 20, 16, dtype=torch.bfloat16)
    expected, _ = sdpa_attention_forward(_Layer(), long_q, kb[:1], vb[:1], None)
    got, _ = cpu_attention(_Layer(), long_q, kb[:1], vb[:1], None, gclm_prompt=True, softcap=None)
    assert not torch.equal(got, expected)  # the blocked path ran
    with pytest.raises(ValueError, match="softcap"):  # SDPA's own refusal: the path did not run
        cpu_attention(_Layer(), long_q, kb[:1], vb[:1], None, gclm_prompt=True, softcap=30.0)
    assert cpu_attention(_Layer(), qb, kb, vb, mask.bfloat16())[0].shape == (2, 1, 6, 16)


def test_use_on_switches_cpu_sdpa_models_only(tiny_llama):
    eager = tiny_llama(vocab_size=40, attn_implementation="eager")
    assert not use_on(eager)
    assert eager.config._attn_implementation == "eager"
    model = tiny_llama(vocab_size=40)
    assert use_on(model) and model.config._attn_implementation == ATTENTION
    assert KVStore(model, 1).packs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_a_switched_model_gives_a_plain_forwards_logits(tiny_llama, monkeypatch, dtype):
    """A prompt in chunks of 20 (the blocked path), decode steps and drafts over two slots,
    and a packed pass with a prompt's chunk: every row's logits are a plain forward's
    (SDPA over the whole sequence), to float32 rounding, or bfloat16's."""
    model = tiny_llama(
        vocab_size=50,
        max_position_embeddings=256,
        hidden_size=48,
        num_attention_heads=6,
        num_key_value_heads=2,
    ).to(dtype)
    assert use_on(model)
    ran: list[str] = []
    for name in ("causal_attention", "masked_attention"):
        real = getattr(attention, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> torch.Tensor:
            ran.append(_name)
            return _real(*args, **kw)

        for module in (attention, packed):
            monkeypatch.setattr(module, name, spy)
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}

    def plain(tokens: list[int]) -> torch.Tensor:
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]

    store = KVStore(model, 3)
    text = {0: [1 + i % 47 for i in range(60)], 1: [2 + i % 31 for i in range(25)]}
    for slot, prompt in text.items():
        assert store.claim(prompt) == slot
        for i in range(0, len(prompt), 20):
            logits = store.extend({slot: prompt[i : i + 20]})
        torch.testing.assert_close(logits[0], plain(prompt), **tolerance)
    for step in range(3):
        logits = store.extend({0: [5 + step], 1: [9 + step]})
        text[0].append(5 + step)
        text[1].append(9 + step)
        for i, slot in enumerate((0, 1)):
            torch.testing.assert_close(logits[i], plain(text[slot]), **tolerance)
    long = list(range(3, 43))
    assert store.claim(long) == 2
    store.extend({2: long[:20]})
    decoded, prefilled = store.extend_packed({0: [7, 8], 1: [4]}, {2: long[20:]})
    torch.testing.assert_close(prefilled[0], plain(long), **tolerance)
    torch.testing.assert_close(decoded[0, 0], plain(text[0] + [7]), **tolerance)
    torch.testing.assert_close(decoded[0, 1], plain(text[0] + [7, 8]), **tolerance)
    torch.testing.assert_close(decoded[1, 0], plain(text[1] + [4]), **tolerance)
    # 2 layers: 6 prompt chunks of 20 (one in the packed pass) run blocked (float32: only
    # on AVX512); a chunk of 5, 3 steps and 2 packed decode rows run masked in bfloat16
    # (float32: SDPA)
    blocked = dtype == torch.bfloat16 or attention.FLOAT32_BLOCKED
    assert ran.count("causal_attention") == (2 * 6 if blocked else 0)
    assert ran.count("masked_attention") == (2 * (1 + 3 + 2) if dtype == torch.bfloat16 else 0)


def test_the_engine_switches_its_cpu_model(tiny_batch_engine):
    engine = tiny_batch_engine()
    try:
        assert engine.model.config._attn_implementation == ATTENTION
    finally:
        engine.shutdown()
