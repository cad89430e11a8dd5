"""Fixtures shared across the suite: the embedded model's tokenizer and vocabulary.

The first use on a machine converts the embedded GGUF model once (~30 s); later sessions
load the cached tokenizer in well under a second.
"""

from __future__ import annotations

import pytest

from gclm.compiler.vocabulary import TokenVocabulary


@pytest.fixture(scope="session")
def embedded_tokenizer():
    from gclm.server.model import load_tokenizer

    return load_tokenizer(None)


@pytest.fixture(scope="session")
def embedded_vocab(embedded_tokenizer) -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(embedded_tokenizer)
