"""Turn compiled tables plus per-sequence state plus budget into token masks."""

from gclm.masking.bitmask import allocate_bitmask, apply_bitmask, fill_bitmask, fill_unconstrained
from gclm.masking.masks import MaskTable, mask_source, mask_table, num_words, whole_table
from gclm.masking.source import MaskSource
from gclm.masking.state import ConstraintState, check_budget

__all__ = [
    "MaskSource",
    "MaskTable",
    "ConstraintState",
    "allocate_bitmask",
    "apply_bitmask",
    "check_budget",
    "fill_bitmask",
    "fill_unconstrained",
    "mask_source",
    "mask_table",
    "num_words",
    "whole_table",
]
