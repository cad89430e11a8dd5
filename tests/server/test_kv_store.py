"""KVStore on a tiny random Llama: whatever the order of claims, releases, reuse, copies and
compaction, every slot's logits are those of a plain forward pass over its own tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

import gclm.server.engine.transformers.kv_store as kv_store
from gclm.server.engine.transformers.kv_store import KVStore, kv_bytes_per_token, plan_slots


@pytest.fixture(scope="module")
def model(tiny_llama) -> LlamaForCausalLM:
    return tiny_llama(vocab_size=40, max_position_embeddings=128)


def plain(model: LlamaForCausalLM, tokens: list[int]) -> torch.Tensor:
    """Next-token logits [V] of one sequence, without a cache."""
    return model(input_ids=torch.tensor([tokens])).logits[0, -1]


class Rows:
    """The store under test beside what each slot should hold."""

    def __init__(self, model: LlamaForCausalLM, slots: int) -> None:
        self.model = model
        self.store = KVStore(model, slots, chunk=4)  # a small chunk: capacity grows often
        self.text: dict[int, list[int]] = {}

    def admit(self, prompt: list[int]) -> int:
        slot = self.store.claim(prompt)
        held = self.store.tokens[slot]
        assert held == prompt[: len(held)] and len(held) < len(prompt)
        self.text[slot] = list(prompt)
        self.check({slot: prompt[len(held) :]}, extend=False)
        return slot

    def check(self, inputs: dict[int, list[int]], extend: bool = True) -> None:
        if extend:
            for slot, tokens in inputs.items():
                self.text[slot] += tokens
        logits = self.store.extend(inputs)
        for i, slot in enumerate(inputs):
            torch.testing.assert_close(logits[i], plain(self.model, self.text[slot]))
            assert self.store.tokens[slot] == self.text[slot]


@torch.no_grad()
def test_prefill_then_decode_in_place(model):
    rows = Rows(model, 4)
    a = rows.admit([1, 2, 3, 4, 5])
    b = rows.admit([6, 7])
    assert (a, b) == (0, 1)
    for step in range(6):  # past the first chunks of capacity
        rows.check({a: [10 + step], b: [20 + step]})
    assert rows.store.capacity >= 11
    # A run of several tokens in one row (a draft) beside one token in the other.
    rows.check({a: [30, 31, 32], b: [33]})
    logits = rows.store.extend({a: [34, 35], b: [36]}, every_position=True)
    assert logits.shape[:2] == (2, 2)
    torch.testing.assert_close(logits[0, 0], plain(model, rows.text[a] + [34]))
    torch.testing.assert_close(logits[0, 1], plain(model, rows.text[a] + [34, 35]))
    torch.testing.assert_close(logits[1, 0], plain(model, rows.text[b] + [36]))


@torch.no_grad()
def test_holes_reuse_and_compaction(model):
    rows = Rows(model, 4)
    a, b, c = rows.admit([1, 2, 3]), rows.admit([4, 5, 6, 7]), rows.admit([8, 9])
    rows.check({a: [1], b: [2], c: [3]})
    rows.store.release(b)  # a hole below c: computed and ignored
    del rows.text[b]
    rows.check({a: [4], c: [5]})
    # A new prompt sharing b's first tokens takes b's slot and keeps those positions.
    d = rows.admit([4, 5, 6, 11, 12])
    assert d == b and rows.store.tokens[d][:3] == [4, 5, 6]
    rows.check({a: [6], d: [7], c: [8]})
    # The top row moves into a freed slot; the rest stay where they are.
    rows.store.release(a)
    del rows.text[a]
    assert rows.store.compact() == (c, a)
    rows.text[a] = rows.text.pop(c)
    assert rows.store.high == 2
    rows.check({a: [9], d: [10]})
    assert rows.store.compact() is None


@torch.no_grad()
def test_prefix_copied_from_a_running_slot(model, monkeypatch):
    monkeypatch.setattr(kv_store, "MIN_COPIED_PREFIX", 3)
    rows = Rows(model, 3)
    a = rows.admit([1, 2, 3, 4, 5, 6])
    rows.check({a: [7]})
    b = rows.admit([1, 2, 3, 4, 5, 9])  # shares five positions with a, which is running
    assert b != a and rows.store.tokens[b] == [1, 2, 3, 4, 5, 9]
    c = rows.store.claim_copy(a)  # an n > 1 choice: every position of a
    rows.text[c] = list(rows.text[a])
    rows.check({a: [8], b: [8], c: [9]})


@torch.no_grad()
def test_a_prompt_never_reuses_all_of_itself(model):
    rows = Rows(model, 2)
    a = rows.admit([1, 2, 3])
    rows.store.release(a)
    again = rows.store.claim([1, 2, 3])
    assert rows.store.tokens[again] == [1, 2]  # the last token runs, to give its logits


def test_claiming_every_slot(model):
    store = KVStore(model, 1)
    store.claim([1, 2])
    with pytest.raises(ValueError, match="Every KV slot is in use"):
        store.claim([3, 4])


def test_slots_from_memory(model):
    per_token = kv_bytes_per_token(model.config, torch.float32)
    assert per_token == 2 * 2 * 2 * 8 * 4  # K and V, 2 layers, 2 KV heads, head_dim 8, fp32
    # Without --max-batch: as many slots as hold the typical length (capped by the context).
    slots, positions = plan_slots(model, context_length=128, memory=per_token * 128 * 5)
    assert (slots, positions) == (5, 128)
    slots, _ = plan_slots(model, context_length=128, memory=per_token * 128 * 1000)
    assert slots == kv_store.MAX_SLOTS
    # With it: each slot gets an equal share, never more than the context.
    assert plan_slots(model, context_length=128, max_batch=2, memory=per_token * 300) == (2, 128)
    big = plan_slots(model, context_length=4096, max_batch=2, memory=per_token * 600)
    assert big == (2, 300)
    with pytest.raises(ValueError, match="positions per sequence.*--kv-memory"):
        plan_slots(model, context_length=4096, max_batch=8, memory=per_token * 600)


@torch.no_grad()
def test_a_reserved_store_grows_once_for_a_prompt_fed_in_chunks(model):
    """The engine reserves a request's prompt plus max_tokens at admission: a prompt fed in
    chunks then grows the buffers once, not at every chunk of capacity."""
    rows = Rows(model, 2)
    prompt = list(range(1, 31))
    rows.store.reserve(len(prompt) + 8)
    assert (rows.store.capacity, rows.store.growths) == (40, 1)  # chunk=4: rounded up
    slot = rows.store.claim(prompt)
    rows.text[slot] = []
    for start in range(0, len(prompt), 6):  # chunks of 6, then decode
        rows.check({slot: prompt[start : start + 6]})
    for token in range(8):
        rows.check({slot: [token]})
    assert (rows.store.capacity, rows.store.growths) == (40, 1)
    rows.check({slot: [9, 10, 11]})  # past the reservation (41): it grows as before
    assert rows.store.growths == 2


@torch.no_grad()
def test_layers_grow_a_few_per_pass_unless_a_pass_writes_past_them(model, monkeypatch):
    """A reservation far past what is written is grown over several passes, at most
    GROWTH_SECONDS of copying each (here none: a layer grows only when a pass writes past
    its buffers), and the logits stay those of a plain forward throughout."""
    for budget, grown_at_once in ((0.0, False), (60.0, True)):
        monkeypatch.setattr(kv_store, "GROWTH_SECONDS", budget)
        rows = Rows(model, 2)
        slot = rows.admit([1, 2, 3, 4, 5])
        rows.store.reserve(40)  # a long request admitted: room for 40 positions
        rows.check({slot: [6]})  # writes position 5: inside every layer's first buffers
        layers = rows.store.cache.layers
        sizes = {layer.keys.shape[2] for layer in layers}
        assert sizes == ({40} if grown_at_once else {8})
        for token in range(7, 20):  # past 8: each layer grows in the pass that needs it
            rows.check({slot: [token]})
        assert {layer.keys.shape[2] for layer in layers} == {40}


@pytest.mark.parametrize("force_gqa", ["0", "1"])
def test_masked_passes_match_a_plain_forward_with_shared_kv_heads(model, monkeypatch, force_gqa):
    """On the CPU the engine has SDPA share key/value heads in masked passes too
    (engine._gqa_in_masked_sdpa): a prompt's later chunks and a decode over slots of
    different lengths still give a plain forward's logits (the tiny Llama has 4 query heads
    over 2 key/value heads)."""
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", force_gqa)
    rows = Rows(model, 3)
    long = rows.store.claim(list(range(1, 25)))
    rows.text[long] = []
    for start in range(0, 24, 8):
        rows.check({long: list(range(1, 25))[start : start + 8]})
    short = rows.admit([5, 6, 7])
    rows.check({long: [3], short: [4]})
    rows.check({short: [9, 10, 11]})


@pytest.mark.parametrize("force_gqa", ["0", "1"])
def test_a_packed_pass_matches_a_plain_forward(model, monkeypatch, force_gqa):
    """Decoding rows (one token, or a run of drafts) and prompts' chunks (a first chunk, a
    later one) in one packed pass: every row's logits are a plain forward's, and the slots
    hold what they were given; later passes of any kind read what the packed one wrote."""
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", force_gqa)
    rows = Rows(model, 4)
    assert rows.store.packs  # a tiny Llama on the CPU attends with SDPA
    a, b = rows.admit([1, 2, 3, 4, 5]), rows.admit([6, 7])
    long = rows.store.claim(list(range(1, 25)))
    rows.text[long] = []
    rows.check({long: list(range(1, 9))})
    fresh = rows.store.claim([30, 31, 32, 33])
    rows.text[fresh] = []
    runs, rests = {a: [10, 11, 12], b: [13]}, {long: list(range(9, 17)), fresh: [30, 31, 32]}
    decoded, prefilled = rows.store.extend_packed(runs, rests)
    assert decoded.shape[:2] == (2, 3) and prefilled.shape[0] == 2
    for slot, tokens in (runs | rests).items():
        rows.text[slot] += tokens
        assert rows.store.tokens[slot] == rows.text[slot]
    for i, slot in enumerate(runs):
        for j in range(len(runs[slot])):
            cut = len(rows.text[slot]) - len(runs[slot]) + j + 1
            torch.testing.assert_close(decoded[i, j], plain(model, rows.text[slot][:cut]))
    for i, slot in enumerate(rests):
        torch.testing.assert_close(prefilled[i], plain(model, rows.text[slot]))
    rows.check({a: [14], b: [15], long: [16], fresh: [17]})


def test_only_sdpa_on_the_cpu_packs(tiny_llama):
    """Packed passes use an SDPA attention of their own: a model on eager attention runs
    the two-pass path."""
    eager = tiny_llama(vocab_size=40, attn_implementation="eager")
    assert not KVStore(eager, 2).packs
