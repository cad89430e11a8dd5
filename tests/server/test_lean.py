"""lean.py's decode pass gives the model's own logits, to the bit, through the KV store:
a tiny random Llama decoding rows of different lengths (holes between slots included), in
float32 and bfloat16, against the same store running the model's forward."""

from __future__ import annotations

import pytest
import torch

from gclm.server.engine.transformers.kv_store import KVStore
from gclm.server.engine.transformers.lean import LeanLlama


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_logits_are_the_models(tiny_llama, dtype):
    model = tiny_llama(vocab_size=300, max_position_embeddings=128).to(dtype)
    assert LeanLlama.of(model) is not None
    stores = [KVStore(model, 4, lean=True), KVStore(model, 4, lean=False)]
    assert stores[0]._lean is not None and stores[1]._lean is None
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 300, (n,), generator=g).tolist() for n in (5, 4, 9)]
    with torch.inference_mode():
        for store in stores:
            for prompt in prompts:
                store.extend({store.claim(prompt): prompt})
            store.release(1)  # a hole: the pass runs over views of slots [0, 3)
        for step in range(6):
            feed = {0: [step + 3], 2: [step + 7]}  # slot 1 is a hole
            lean, full = (store.extend(feed, every_position=step % 2 == 0) for store in stores)
            assert torch.equal(lean, full)


def test_only_a_llama_in_eval_mode(tiny_llama):
    model = tiny_llama(vocab_size=300)
    model.train()
    assert LeanLlama.of(model) is None
    assert LeanLlama.of(torch.nn.Linear(2, 2)) is None
