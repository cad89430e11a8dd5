"""Turn compiled tables plus per-sequence state plus budget into token masks."""

from gclm.masking.bitmask import allocate_bitmask, apply_bitmask, fill_bitmask, fill_unconstrained
from gclm.masking.masks import MaskTable, mask_table, num_words
from gclm.masking.state import ConstraintState, check_budget

__all__ = [
    "MaskTable",
    "ConstraintState",
    "allocate_bitmask",
    "apply_bitmask",
    "check_budget",
    "fill_bitmask",
    "fill_unconstrained",
    "mask_table",
    "num_words",
]
