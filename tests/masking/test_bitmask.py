"""The batch buffer: allocating, filling rows by index, applying to (padded) logits."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from dfa_strategies import bits_of, table_from_edges

from gclm.errors import InternalError
from gclm.masking import (
    ConstraintState,
    allocate_bitmask,
    apply_bitmask,
    fill_bitmask,
    fill_unconstrained,
)

INF = float("inf")


@pytest.fixture
def table():
    """Tokens 0..39, EOS 39: state 0 -(0|31|32)-> 1 (accepting)."""
    return table_from_edges(40, 39, 2, [1], [(0, 0, 1), (0, 31, 1), (0, 32, 1)])


def test_allocate_shape_and_dtype():
    bitmask = allocate_bitmask(4, 40)
    assert bitmask.shape == (4, 2)
    assert bitmask.dtype == torch.int32
    with pytest.raises(ValueError):
        allocate_bitmask(0, 40)


def test_fill_rows_by_index(table):
    bitmask = allocate_bitmask(3, 40)
    seq = ConstraintState(table)
    fill_bitmask(bitmask, 2, seq, 5)
    fill_unconstrained(bitmask, 0, 40)
    assert bits_of(bitmask[2]) == {0, 31, 32}
    assert bits_of(bitmask[0]) == set(range(40))  # nothing past the tokenizer's last id
    assert bits_of(bitmask[1]) == set()  # untouched


def test_fill_forward_only_ignores_budget(table):
    bitmask = allocate_bitmask(1, 40)
    fill_bitmask(bitmask, 0, ConstraintState(table, budget_aware=False), None)
    assert bits_of(bitmask[0]) == {0, 31, 32}


def test_fill_checks_width_and_finished(table):
    with pytest.raises(ValueError, match="allocate it with the tokenizer's vocab_size"):
        fill_bitmask(allocate_bitmask(1, 100), 0, ConstraintState(table), 1)
    seq = ConstraintState(table)
    seq.advance(0)
    seq.advance(39)
    with pytest.raises(InternalError, match="already emitted EOS"):
        fill_bitmask(allocate_bitmask(1, 40), 0, seq, 1)


def test_empty_row_raises_instead_of_masking_everything(table):
    # Non-accepting state 0 with no budget: every logit would be -inf, sampling NaN.
    with pytest.raises(InternalError, match="No token is allowed"):
        fill_bitmask(allocate_bitmask(1, 40), 0, ConstraintState(table), 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_apply_masks_padded_logit_columns(table, dtype):
    # The model's output layer has 64 columns for a 40-token vocabulary.
    bitmask = allocate_bitmask(2, 40)
    fill_bitmask(bitmask, 0, ConstraintState(table), 1)
    fill_unconstrained(bitmask, 1, 40)
    logits = torch.zeros(2, 64, dtype=dtype)  # [B, V_logits]
    apply_bitmask(logits, bitmask)
    finite = torch.isfinite(logits)
    assert torch.nonzero(finite[0]).flatten().tolist() == [0, 31, 32]
    assert torch.nonzero(finite[1]).flatten().tolist() == list(range(40))
    assert (logits[~finite] == -INF).all()


def test_apply_keeps_allowed_values_and_fewer_logits_than_bits(table):
    bitmask = allocate_bitmask(1, 40)
    fill_bitmask(bitmask, 0, ConstraintState(table), 1)
    logits = torch.arange(33, dtype=torch.float32)[None]  # [1, 33]: fewer columns than 64 bits
    apply_bitmask(logits, bitmask)
    assert logits[0, 0] == 0 and logits[0, 31] == 31 and logits[0, 32] == 32
    assert torch.isinf(logits).sum() == 30


def test_apply_on_slice_of_buffer_and_shape_errors(table):
    bitmask = allocate_bitmask(8, 40)
    fill_unconstrained(bitmask, 0, 40)
    logits = torch.zeros(1, 40)
    apply_bitmask(logits, bitmask[:1])
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="same B"):
        apply_bitmask(torch.zeros(2, 40), bitmask[:1])
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask(logits, bitmask[:1].long())


def _reference_allowed(words: np.ndarray, columns: int) -> np.ndarray:
    """bool [B, columns]: the bits of `words` [B, W], False past 32 * W."""
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").astype(bool)
    out = np.zeros((words.shape[0], columns), dtype=bool)
    n = min(columns, bits.shape[1])
    out[:, :n] = bits[:, :n]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_compiled_and_torch_paths_agree_with_the_bits(dtype):
    rng = np.random.default_rng(0)
    words = rng.integers(-(2**31), 2**31, size=(4, 7), dtype=np.int64).astype(np.int32)
    words[0, :3] = -1  # all allowed, then mixed
    words[1, 2:5] = 0  # all disallowed
    words[2] = -1
    tensor = torch.from_numpy(words)  # [4, 7]
    for columns in (7 * 32, 7 * 32 - 5, 7 * 32 + 9, 33):
        base = torch.randn(4, columns).to(dtype)
        fast = base.clone()
        apply_bitmask(fast, tensor)  # contiguous on CPU: the compiled pass
        # Columns in memory order but a row stride of 1 is not: the torch path.
        slow = base.t().contiguous().t()
        assert slow.stride(-1) != 1
        apply_bitmask(slow, tensor)
        allowed = _reference_allowed(words, columns)
        for out in (fast, slow):
            assert torch.equal(torch.isinf(out), torch.from_numpy(~allowed))
            assert (out[~torch.from_numpy(allowed)] == -INF).all()
            assert torch.equal(out[torch.from_numpy(allowed)], base[torch.from_numpy(allowed)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_apply_on_cuda(table):
    bitmask = allocate_bitmask(1, 40)
    fill_bitmask(bitmask, 0, ConstraintState(table), 1)
    logits = torch.zeros(1, 64, device="cuda")
    apply_bitmask(logits, bitmask)
    assert torch.nonzero(torch.isfinite(logits[0])).flatten().tolist() == [0, 31, 32]


def test_masking_loads_without_numba() -> None:
    # vLLM's workers load gclm.masking (the logits processor) before their start-up scans
    # every loaded module's namespace, which fails on llvmlite's objects: numba must come
    # with the first CPU apply or lazy compile, not with the import.
    code = "import sys, gclm.masking, gclm.compiler.service.cache; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
