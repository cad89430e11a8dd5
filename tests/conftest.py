"""Fixtures shared across the suite (the embedded model's tokenizer and vocabulary, a builder
of tiny random Llama models) and the rule that marks the slow tests.

The first use on a machine converts the embedded GGUF model once (~30 s); later sessions
load the cached tokenizer in well under a second.

Test tiers: `make check` runs `-m "not slow"`. A test is `slow` when it starts a server or
loads the embedded model through a fixture (`server` is added beside it for the servers),
carries `e2e` or `vllm`, or is named in SLOW_TESTS (a module or a test, measured at seconds).
A test that does such work some other way takes `pytestmark = pytest.mark.e2e`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gclm.compiler.vocab.vocabulary import TokenVocabulary

# Fixtures that start a real server: `gclm serve` in a subprocess, or vLLM's.
SERVER_FIXTURES = frozenset(
    {"gclm_server", "thinking_server", "vllm_gclm_servers", "vllm_server", "o200k_server"}
)
# Fixtures that load the embedded model's weights.
MODEL_FIXTURES = frozenset({"float32_engine"})
SLOW_MARKERS = ("e2e", "vllm")
# Tests that take seconds each without one of the above: a module's path from the repository
# root, or a test's node id. Measured on the 2-core machine (seconds for the module's tests).
SLOW_TESTS = (
    "tests/bench/test_budget_forced.py",  # 70 s: the compiler bounds forced budgets
    "tests/compiler/test_background.py",  # 16 s: compile pools whose compiles time out
    "tests/compiler/test_bench_compile.py",  # 6 s: the compile benchmark on tiny schemas
    "tests/compiler/test_compile_progress.py",  # 11 s: a compile pool, retried at Retry-After
    "tests/compiler/service/test_first_mask.py::test_the_pool_sends",  # 7 s: a compile pool
    "tests/compiler/service/test_first_mask.py::test_a_dfa_over",  # 3 s: a compile pool
    "tests/compiler/service/test_first_mask.py::test_a_first_compile",  # 2-3 s each: a compile pool
    "tests/compiler/service/test_pool.py",  # 12 s: compile worker processes started and killed
    "tests/compiler/service/test_worker.py",  # 3 s: the same, one worker
    "tests/server/test_cli.py",  # 50 s: `gclm compile` in subprocesses
    "tests/server/test_engine_side_prefill.py",  # 37 s: a prefill thread beside the steps
    "tests/server/test_openapi.py",  # 23 s: schemathesis over the whole API
    "tests/server/test_vllm_engine.py",  # 19 s: `gclm serve --engine vllm` in a subprocess
    "tests/test_layout.py::test_public_api_imports_from_gclm_in_a_fresh_interpreter",  # 10 s
    "tests/test_layout.py::test_wheel_installs_only_the_gclm_namespace",  # a wheel built
)


def pytest_configure(config: pytest.Config) -> None:
    stale = [name for name in SLOW_TESTS if not (config.rootpath / name.split("::")[0]).is_file()]
    if stale:
        raise pytest.UsageError(
            f"tests/conftest.py's SLOW_TESTS names files that do not exist: {stale}; "
            "rename or remove them there"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks `server` and `slow` by the rule in this module's docstring."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)
        if (
            fixtures & (SERVER_FIXTURES | MODEL_FIXTURES)
            or any(item.get_closest_marker(name) for name in SLOW_MARKERS)
            or item.nodeid.startswith(SLOW_TESTS)
        ):
            item.add_marker(pytest.mark.slow)


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
