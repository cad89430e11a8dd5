"""Fixtures shared across the suite: the embedded model's tokenizer and vocabulary, and a
builder of tiny random Llama models.

The first use on a machine converts the embedded GGUF model once (~30 s); later sessions
load the cached tokenizer in well under a second.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gclm.compiler.vocabulary import TokenVocabulary


@pytest.fixture(scope="session")
def embedded_tokenizer():
    from gclm.server.engine.model_loader import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def embedded_vocab(embedded_tokenizer) -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(embedded_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama() -> Callable[..., Any]:
    """`tiny_llama(vocab_size=..., **config)`: a random LlamaForCausalLM in eval mode, built
    after `torch.manual_seed(0)`, 2 layers of width 32 with 4 heads on 2 KV heads unless the
    keywords (any LlamaConfig field) say otherwise."""

    def build(**config: Any) -> Any:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        shape = {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
        return LlamaForCausalLM(LlamaConfig(**(shape | config))).eval()

    return build
