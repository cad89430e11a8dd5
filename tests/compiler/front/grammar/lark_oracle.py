"""The grammar tests' shared checks: compile a Lark grammar for a small vocabulary, generate
through the masks at a budget, and parse what comes out with the `lark` package."""

from __future__ import annotations

import functools
import re

import lark
import torch

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.front.regex import to_regex
from gclm.compiler.vocab.vocabulary import TokenVocabulary
from gclm.compiler.whole.compile import compile_constraint
from gclm.compiler.whole.tables import CompiledTable
from gclm.masking import (
    ConstraintState,
    MaskSource,
    allocate_bitmask,
    apply_bitmask,
    check_budget,
    fill_bitmask,
)

# Every single byte (any UTF-8 text can be spelled), a few multi-byte words that cross the
# grammars' token boundaries, and EOS last.
WORDS = [b"  ", b"12", b"3.", b"(1", b"+ ", b"ab", b'"a', b'a"', b", ", b"SELECT", b"\xc3\xa9"]
VOCAB = TokenVocabulary(
    (*(bytes([b]) for b in range(256)), *WORDS, None), 256 + len(WORDS), "plain"
)


def checker(grammar: str) -> lark.Lark:
    """Lark's Earley parser with the lexer that tries every split of the text into tokens:
    it accepts exactly the grammar's language."""
    return lark.Lark(grammar, parser="earley", lexer="dynamic_complete", start="start")


def parses(grammar: str, text: str) -> bool:
    try:
        _checker(grammar).parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


@functools.cache
def _checker(grammar: str) -> lark.Lark:
    return checker(grammar)


def regex_accepts(grammar: str, text: str) -> bool:
    """`text` matches the grammar's compiled regex (Python `re`: the regex is written in the
    syntax both engines share)."""
    return re.fullmatch(to_regex(Constraint.grammar(grammar)).regex, text) is not None


@functools.cache
def table(grammar: str) -> CompiledTable:
    return compile_constraint(Constraint.grammar(grammar), VOCAB)


def generate(grammar: str, budget: int, seed: int, space_bias: float = 0.0) -> str:
    """One output through the masks with random logits, at most `budget` tokens."""
    t = table(grammar)
    bias = torch.zeros(t.vocab_size)
    bias[t.eos_token_id] = -space_bias  # longer outputs
    return sample(t, budget, seed, bias)


def sample(
    t: CompiledTable | MaskSource, budget: int, seed: int, bias: torch.Tensor, scale: float = 4.0
) -> str:
    """One output of VOCAB through `t`'s masks, at most `budget` tokens: random logits
    (times `scale`) plus `bias` [V], sampled; checked to end accepting within budget."""
    check_budget(t, budget)
    gen = torch.Generator().manual_seed(seed)
    state = ConstraintState(t)
    bitmask = allocate_bitmask(1, VOCAB.size)
    out: list[int] = []
    left = budget
    while not state.must_stop(left):
        fill_bitmask(bitmask, 0, state, left)
        logits = torch.randn(1, VOCAB.size, generator=gen) * scale + bias  # [1, V]
        apply_bitmask(logits, bitmask)
        tok = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        state.advance(tok, left)
        if state.finished:
            break
        out.append(tok)
        left -= 1
    assert len(out) <= budget
    assert state.is_accepting
    return VOCAB.decode(out)


def outputs_parse(grammar: str, extra: int = 6, seeds: int = 4) -> list[str]:
    """Outputs at every budget from the minimum to `extra` above it, each checked by lark;
    returns them."""
    t = table(grammar)
    texts = []
    for budget in range(t.min_tokens, t.min_tokens + extra + 1):
        for seed in range(seeds):
            text = generate(grammar, budget, seed, space_bias=2.0 * (seed % 2))
            assert parses(grammar, text), (budget, seed, text)
            texts.append(text)
    return texts
