"""Fixtures of the compiler tests: the 200k-token (o200k_base) model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gclm.compiler.vocab.vocabulary import TokenVocabulary


@pytest.fixture(scope="session")
def o200k_dir() -> Path:
    """bench/o200k.py's model directory (o200k_base tokenizer, one-layer random Llama, 51 MB),
    built on first use and kept in gclm's cache directory ($GCLM_O200K_DIR to move it)."""
    pytest.importorskip("bpe_openai", reason="pip install bpe-openai==0.1.4 tiktoken (dev)")
    pytest.importorskip("tiktoken", reason="pip install tiktoken (dev)")
    from bench.o200k import build

    return build()


@pytest.fixture(scope="session")
def o200k_tokenizer(o200k_dir: Path) -> Any:
    from gclm.server.engine.model_loader import load_tokenizer

    return load_tokenizer(str(o200k_dir))


@pytest.fixture(scope="session")
def o200k_vocab(o200k_tokenizer: Any) -> TokenVocabulary:
    return TokenVocabulary.from_tokenizer(o200k_tokenizer)
