"""Turn compiled tables plus per-sequence state plus budget into token masks."""

from masking.bitmask import allocate_bitmask, apply_bitmask, fill_bitmask, fill_unconstrained
from masking.masks import MaskTable, mask_table, num_words
from masking.sequence import SequenceState, check_budget

__all__ = [
    "MaskTable",
    "SequenceState",
    "allocate_bitmask",
    "apply_bitmask",
    "check_budget",
    "fill_bitmask",
    "fill_unconstrained",
    "mask_table",
    "num_words",
]
