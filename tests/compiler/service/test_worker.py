"""Compiling in a worker process: results, errors, and the time and memory limits."""

from __future__ import annotations

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.pool import CompilerPool
from gclm.compiler.service.worker import CompileLimits
from gclm.errors import (
    CompileLimitError,
    CompilerBusyError,
    ConstraintError,
    UnsupportedSchemaError,
)

# Many free-text fields with long bounds: about 12 s of CPU at this vocabulary.
HEAVY = Constraint.json_schema(
    {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "maxLength": 256} for i in range(20)},
    }
)


@pytest.fixture(scope="module")
def pool(embedded_vocab):
    pool = CompilerPool(embedded_vocab, CompileLimits(timeout_s=1.0, cpu_s=1.0), workers=1)
    assert pool.wait_ready(120)
    yield pool
    pool.close()


def test_compiles_in_a_worker(pool, embedded_vocab):
    table = pool.compile(Constraint.choice(["yes", "no"]))
    assert table.min_tokens == 1 and table.shortest_output in {"yes", "no"}
    assert table.vocab_size == embedded_vocab.size


def test_constraint_errors_come_back_with_their_message(pool):
    with pytest.raises(ConstraintError, match="uniqueItems"):
        pool.compile(Constraint.json_schema({"type": "array", "uniqueItems": True, "minItems": 2}))
    assert issubclass(UnsupportedSchemaError, ConstraintError)


def test_timeout_kills_the_compile_and_the_pool_keeps_serving(pool):
    # A 400 when it reached its CPU ceiling (1 s) by the timeout; a 429 when a loaded
    # machine starved it, while it goes on to its ceiling in the background.
    with pytest.raises((CompileLimitError, CompilerBusyError)) as caught:
        pool.compile(HEAVY)
    if isinstance(caught.value, CompileLimitError):
        assert "more than 1 s of CPU time" in caught.value.message
    assert pool.compile(Constraint.regex("[0-9]{3}")).min_tokens >= 1


def test_limits_are_validated():
    with pytest.raises(ValueError, match="timeout"):
        CompileLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory"):
        CompileLimits(memory_bytes=1 << 20)
