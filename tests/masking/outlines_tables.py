"""Tables compiled from an outlines-core Index through its public API (`get_transitions`),
so the masking tests do not depend on the compiler's own pipeline."""

from __future__ import annotations

import numpy as np
import outlines_core

from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.tables import CompiledTable, build_table


def table_from_index(index: outlines_core.Index, vocab: TokenVocabulary) -> CompiledTable:
    """Densify an Index's transitions (EOS edges dropped) into a CompiledTable."""
    transitions = index.get_transitions()
    ids = sorted(
        {index.get_initial_state(), *index.get_final_states(), *transitions}
        | {n for row in transitions.values() for n in row.values()}
    )
    dense = {s: i for i, s in enumerate(ids)}
    edges = [
        (dense[s], t, dense[n])
        for s, row in transitions.items()
        for t, n in row.items()
        if t != vocab.eos_token_id
    ]
    arr = np.array(edges, dtype=np.int64).reshape(-1, 3)  # [E, 3]
    accepting = np.zeros(len(ids), dtype=bool)
    accepting[[dense[s] for s in index.get_final_states()]] = True
    return build_table(
        vocab_size=vocab.size,
        eos_token_id=vocab.eos_token_id,
        initial=dense[index.get_initial_state()],
        num_states=len(ids),
        accepting=accepting,
        src=arr[:, 0],
        tokens=arr[:, 1],
        dst=arr[:, 2],
    )


def table_from_regex(regex: str, vocab: TokenVocabulary) -> CompiledTable:
    """Compile `regex` over `vocab` with outlines-core."""
    return table_from_index(outlines_core.Index(regex, vocab.to_outlines()), vocab)
