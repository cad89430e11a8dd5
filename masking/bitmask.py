"""The batch bitmask: one preallocated int32 [max_batch, W] buffer, rows filled by index,
applied to the logits in one vectorised pass just before sampling.

    bitmask = allocate_bitmask(max_batch, vocab_size)       # once, at engine start
    for i, (dfa, tokens_left) in enumerate(batch):          # each step; dfa: ConstraintState
        fill_bitmask(bitmask, i, dfa, tokens_left)          # or fill_unconstrained
    apply_bitmask(logits, bitmask[:len(batch)])             # logits [B, V_logits]

Filling a row is one copy of a precomputed row (O(W)). Logit columns past the tokenizer's
size (models pad their output layer) are never allowed. On CUDA the pinned buffer is copied
without blocking: refill it only after the step's sampled tokens have been read back.

On CPU one compiled pass (numba) reads the mask a word at a time: a word with every bit set
(inside a JSON string nearly every word is) costs one compare, a clear word one run of -inf
stores, and only mixed words are read bit by bit. The logits are written through an integer
view of their own width, so float32, float16, bfloat16 and float64 share the kernel; a
mixed byte of the mask is one branch-free AND/OR over its eight logits. At 200k
tokens this is 5-20x faster than a byte lookup table over the whole row (bench/first_mask.py).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from gclm.errors import InternalError
from gclm.masking.masks import num_words
from gclm.masking.state import ConstraintState

# -inf's bit pattern in an integer view of each logits dtype.
_NEG_INF_BITS: dict[torch.dtype, tuple[torch.dtype, np.integer]] = {
    torch.float32: (torch.int32, np.int32(np.float32(-np.inf).view(np.int32))),
    torch.float64: (torch.int64, np.int64(np.float64(-np.inf).view(np.int64))),
    torch.float16: (torch.int16, np.int16(np.float16(-np.inf).view(np.int16))),
    torch.bfloat16: (torch.int16, np.int16(np.uint16(0xFF80).view(np.int16))),
}
# [256, 8] per view dtype: for each mask byte, all ones in the lanes whose bit is set.
_KEEP_BITS = np.where((np.arange(256)[:, None] >> np.arange(8)[None, :]) & 1, -1, 0)
_KEEP: dict[torch.dtype, np.ndarray] = {
    view: _KEEP_BITS.astype(np.dtype(str(view).removeprefix("torch.")))
    for view, _ in _NEG_INF_BITS.values()
}
_LITTLE_ENDIAN = sys.byteorder == "little"


def allocate_bitmask(max_batch: int, vocab_size: int) -> torch.Tensor:
    """A zeroed int32 [max_batch, ceil(vocab_size / 32)] CPU buffer (pinned when CUDA is
    available, so that copying it to the GPU does not block)."""
    if max_batch < 1 or vocab_size < 1:
        raise ValueError(f"max_batch and vocab_size must be >= 1, got {max_batch}, {vocab_size}.")
    return torch.zeros(
        (max_batch, num_words(vocab_size)),
        dtype=torch.int32,
        pin_memory=torch.cuda.is_available(),
    )


def _as_array(bitmask: torch.Tensor | np.ndarray) -> np.ndarray:
    return bitmask.numpy() if isinstance(bitmask, torch.Tensor) else bitmask


def fill_bitmask(
    bitmask: torch.Tensor | np.ndarray, row: int, seq: ConstraintState, tokens_left: int | None
) -> None:
    """Write the tokens `seq` may sample next into `bitmask[row]`.

    Args:
        bitmask: int32 [max_batch, W] CPU buffer from `allocate_bitmask` (or a numpy array).
        row: the sequence's index in the batch.
        seq: the sequence's DFA state.
        tokens_left: tokens the sequence may still generate, counting the one being sampled;
            ignored (may be None) when `seq` is not budget-aware.
    Raises:
        InternalError: the sequence already consumed EOS, or no token is allowed.
        ValueError: the buffer was allocated for another vocabulary size.
    """
    buf = _as_array(bitmask)
    masks = seq.masks
    if buf.shape[1] != masks.width:
        raise ValueError(
            f"The bitmask has {buf.shape[1]} words per row but the table's vocabulary needs "
            f"{masks.width}; allocate it with the tokenizer's vocab_size ({masks.vocab_size})."
        )
    if seq.finished:
        raise InternalError("The sequence already emitted EOS; evict it instead of masking it.")
    buf[row] = seq.allowed_row(tokens_left)


@lru_cache(maxsize=8)
def _all_tokens_row(vocab_size: int) -> np.ndarray:
    row = np.full(num_words(vocab_size), -1, dtype=np.int32)
    tail = vocab_size % 32
    if tail:
        # Bits past the tokenizer's last id stay clear: they name no token.
        row.view(np.uint32)[-1] = np.uint32((1 << tail) - 1)
    row.flags.writeable = False
    return row


def fill_unconstrained(bitmask: torch.Tensor | np.ndarray, row: int, vocab_size: int) -> None:
    """Allow every token id below `vocab_size` in `bitmask[row]` (a request without a
    constraint sharing the batch)."""
    buf = _as_array(bitmask)
    if buf.shape[1] != num_words(vocab_size):
        raise ValueError(
            f"The bitmask has {buf.shape[1]} words per row, not {num_words(vocab_size)} "
            f"for vocab_size {vocab_size}."
        )
    buf[row] = _all_tokens_row(vocab_size)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set every logit whose bit is clear to -inf, in place, on the logits' device.

    Args:
        logits: [B, V_logits] on CPU or CUDA; columns at or past 32 * W are always disallowed.
        bitmask: int32 [B, W] (moved to the logits' device if it is elsewhere).
    """
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"apply_bitmask needs logits [B, V] and bitmask [B, W] with the same B; got "
            f"{tuple(logits.shape)} and {tuple(bitmask.shape)}."
        )
    if bitmask.dtype != torch.int32:
        raise ValueError(f"The bitmask must be int32, got {bitmask.dtype}.")
    batch, vocab = logits.shape
    covered = min(vocab, 32 * int(bitmask.shape[1]))
    if vocab > covered:
        logits[:, covered:] = -torch.inf  # padded output columns: no token has these ids
    if (
        logits.device.type == "cpu"
        and logits.dtype in _NEG_INF_BITS
        and not logits.requires_grad
        and logits.stride(-1) == 1
        and _LITTLE_ENDIAN
    ):
        # torch's CPU masked_fill mispredicts on irregular masks; a word-at-a-time pass
        # skips the all-allowed words and fills the all-disallowed ones in runs.
        view_dtype, neg_inf = _NEG_INF_BITS[logits.dtype]
        out = logits.view(view_dtype).numpy()  # [B, V_logits], the logits' own memory
        _word_pass()(out, bitmask.cpu().numpy(), covered, neg_inf, _KEEP[view_dtype])
        return
    # Four kernels on a GPU: the copy of the rows, AND with each bit, == 0, masked_fill.
    words = bitmask.to(logits.device, non_blocking=True)  # [B, W]
    disallowed = (words.unsqueeze(-1) & _bit_values(logits.device)) == 0  # [B, W, 32]
    logits[:, :covered].masked_fill_(disallowed.view(batch, -1)[:, :covered], -torch.inf)


@lru_cache(maxsize=1)
def _word_pass() -> Any:
    """_mask_words compiled, on the first CPU apply. numba is imported here, not with the
    module: gclm.masking loads inside vLLM's workers, whose start-up scans every loaded
    module's namespace and fails on llvmlite's objects."""
    import numba as nb

    from gclm.compiler import cache_per_version

    cache_per_version(__file__)
    return nb.njit(cache=True, nogil=True)(_mask_words)


def _mask_words(out, words, covered, neg_inf, keep):
    """Write `neg_inf` into out[b, v] for every v < covered whose bit is clear in words[b].
    `keep[byte]` is the eight lanes of a mask byte, all ones where its bit is set: a mixed
    byte is one branch-free AND/OR over eight logits."""
    full = covered >> 5
    for b in range(words.shape[0]):
        row = out[b]
        for w in range(full):
            word = words[b, w]
            if word == -1:
                continue
            base = w << 5
            if word == 0:
                row[base : base + 32] = neg_inf
                continue
            bits = np.uint32(word)
            for k in range(4):
                byte = (bits >> np.uint32(8 * k)) & np.uint32(255)
                if byte == 255:
                    continue
                lanes = keep[byte]
                lo = base + 8 * k
                for j in range(8):
                    row[lo + j] = (row[lo + j] & lanes[j]) | (neg_inf & ~lanes[j])
        bits = np.uint32(words[b, full]) if covered > full << 5 else np.uint32(0)
        for j in range(covered - (full << 5)):
            if not (bits >> np.uint32(j)) & np.uint32(1):
                row[(full << 5) + j] = neg_inf


_BITS: dict[torch.device, torch.Tensor] = {}


def _bit_values(device: torch.device) -> torch.Tensor:
    """int32 [32]: 1 << j for each bit j (bit 31 is the sign bit), kept on each device."""
    bits = _BITS.get(device)
    if bits is None:
        values = [1 << j for j in range(31)] + [-(1 << 31)]
        bits = _BITS[device] = torch.tensor(values, dtype=torch.int32, device=device)
    return bits
