"""Constrained, budget-aware generation with Hugging Face `model.generate()`.

    c = create_constraint(tokenizer, {"type": "json_object"}, max_new_tokens=64)
    out = c.generate(model, **inputs)  # or model.generate(**inputs, max_new_tokens=64,
    #     logits_processor=c.logits_processor, stopping_criteria=c.stopping_criteria)

Every row's output is accepted by the constraint and at most `max_new_tokens` tokens long
(EOS excluded), whether decoding is greedy or sampled. Rows are independent; left padding is
fine. Beam search is refused: beams are reordered between steps and dead beams sample tokens
the mask forbids. `c.generate` refuses it (and a generate() budget below the constraint's)
before generating; a processor handed to generate() directly sees only the tokens, and
refuses beams once they are reordered.

Budget: HF counts EOS against `max_new_tokens`, gclm does not, so the processor gives a row
`max_new_tokens - k` tokens after `k` generated ones; at the last step only tokens that reach
acceptance (or EOS, when accepting) remain, and the row ends valid either way.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from gclm.compiler import CompiledTable, parse_constraint
from gclm.errors import InternalError
from gclm.masking.apply import MaskRow, mask_rows
from gclm.masking.bitmask import allocate_bitmask
from gclm.masking.graceful import POLICY_NAMES, GracefulPolicy
from gclm.masking.policy import BudgetPolicy
from gclm.masking.state import ConstraintState, check_budget

_VOCABS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _vocabulary(tokenizer: Any) -> Any:
    from gclm.compiler import TokenVocabulary

    try:
        vocab = _VOCABS.get(tokenizer)
    except TypeError:  # not weak-referenceable: build it every time
        return TokenVocabulary.from_tokenizer(tokenizer)
    if vocab is None:
        vocab = _VOCABS[tokenizer] = TokenVocabulary.from_tokenizer(tokenizer)
    return vocab


def create_constraint(
    tokenizer: Any, constraint: Any, max_new_tokens: int, *, budget_policy: str = "graceful"
) -> HFConstraint:
    """Compile `constraint` for `tokenizer` and wrap it for `model.generate()`.

    Args:
        tokenizer: the model's Hugging Face tokenizer (it must define an EOS token).
        constraint: a response_format or structured-outputs dict, or a Constraint (see
            `gclm.compiler.front.constraint.parse_constraint`).
        max_new_tokens: the budget; pass the same value to `generate()`.
        budget_policy: "graceful" (pace spare tokens over the output when the budget is
            tight; masking/graceful.py) or "none" (the budget-aware mask alone).
    Raises:
        ConstraintError: the constraint is malformed or cannot be compiled.
        ValueError: an unknown budget_policy.
        BudgetTooSmallError: `max_new_tokens` is below the shortest valid output's length
            (param "max_new_tokens").
    """
    from gclm.compiler import compile_constraint

    if budget_policy not in POLICY_NAMES:
        raise ValueError(
            f"budget_policy must be one of {', '.join(POLICY_NAMES)}, got {budget_policy!r}."
        )
    vocab = _vocabulary(tokenizer)
    table = compile_constraint(parse_constraint(constraint), vocab)
    policy = GracefulPolicy.for_vocab(vocab.token_bytes) if budget_policy == "graceful" else None
    return HFConstraint.from_table(
        table, max_new_tokens, pad_token_id=tokenizer.pad_token_id, policy=policy
    )


@dataclass
class HFConstraint:
    """A compiled constraint plus the processor and stopping criterion that enforce it."""

    table: CompiledTable
    max_new_tokens: int
    logits_processor: LogitsProcessorList = field(repr=False)
    stopping_criteria: StoppingCriteriaList = field(repr=False)
    rows: RowStates = field(repr=False)

    @classmethod
    def from_table(
        cls,
        table: CompiledTable,
        max_new_tokens: int,
        pad_token_id: int | None = None,
        policy: BudgetPolicy | None = None,
    ) -> HFConstraint:
        """Wrap an already compiled table. Raises BudgetTooSmallError like create_constraint.

        `pad_token_id` is the token generate() appends to finished rows (EOS when None);
        `policy` reweights each live row's masked scores (None: the mask alone)."""
        check_budget(table, max_new_tokens, param="max_new_tokens")
        # generate() pads with EOS when the tokenizer has no pad token.
        pad = pad_token_id if pad_token_id is not None else table.eos_token_id
        rows = RowStates(table, max_new_tokens, pad)
        return cls(
            table=table,
            max_new_tokens=max_new_tokens,
            logits_processor=LogitsProcessorList([ConstraintLogitsProcessor(rows, policy)]),
            stopping_criteria=StoppingCriteriaList([ConstraintStoppingCriteria(rows)]),
            rows=rows,
        )

    @property
    def min_tokens(self) -> int:
        """Fewest tokens of any valid output: the smallest usable `max_new_tokens`."""
        return self.table.min_tokens

    def reset(self) -> None:
        """Forget the current generation; the next call starts a new one."""
        self.rows.reset()

    def generate(self, model: Any, **kwargs: Any) -> Any:
        """`model.generate(**kwargs)` under this constraint: its processor and stopping
        criterion after any the caller passes, `max_new_tokens` the constraint's budget.
        Returns what generate() returns.

        Raises:
            ValueError: beam search (num_beams > 1), or a max_new_tokens below the
                constraint's (outputs could be cut off mid-constraint).
        """
        config = kwargs.get("generation_config")
        beams = kwargs.get("num_beams", getattr(config, "num_beams", 1))
        if beams is not None and beams > 1:
            raise ValueError(BEAM_SEARCH)
        budget = kwargs.pop("max_new_tokens", None)
        if budget is None and config is not None:
            budget = getattr(config, "max_new_tokens", None)
        if budget is not None and budget < self.max_new_tokens:
            raise ValueError(
                f"generate(max_new_tokens={budget}) is below the constraint's budget "
                f"({self.max_new_tokens}): outputs could be cut off mid-constraint. Pass "
                "the same max_new_tokens to create_constraint and to generate()."
            )
        processors = LogitsProcessorList(
            [*(kwargs.pop("logits_processor", None) or ()), *self.logits_processor]
        )
        criteria = StoppingCriteriaList(
            [*(kwargs.pop("stopping_criteria", None) or ()), *self.stopping_criteria]
        )
        self.reset()
        return model.generate(
            **kwargs,
            max_new_tokens=self.max_new_tokens if budget is None else budget,
            logits_processor=processors,
            stopping_criteria=criteria,
        )


BEAM_SEARCH = (
    "Beam search (num_beams > 1) is not supported with a gclm constraint: beams are "
    "reordered between steps. Use greedy decoding or sampling."
)


class RowStates:
    """Per-row DFA state for one generate() call, synced from the tokens actually appended.

    The tokens alone tell one generate() call from the next: a call starts anew once the
    stopping criterion has ended every row (generate() stops there), or when the batch size
    changed, or the length is not the last one seen (or one more), or the rows' tokens up to
    the last seen length are other tokens. Then the prompt length is taken afresh: the
    current length for the processor, one less for the stopping criterion (it sees the first
    new token). Beams are refused: rows whose tokens so far are the tracked rows reordered,
    or a criterion shown more rows than the processor masked in the same step.
    """

    def __init__(self, table: CompiledTable, max_new_tokens: int, pad_token_id: int):
        self.table = table
        self.max_new_tokens = max_new_tokens
        self.pad_token_id = pad_token_id
        self.reset()

    def reset(self) -> None:
        self.seqs: list[ConstraintState] = []
        self.abandoned: list[bool] = []  # stopped by another criterion, then padded
        self.prompt_len = 0
        self.length = 0  # input_ids length synced so far
        self._ids: torch.Tensor | None = None
        self._bitmask: torch.Tensor | None = None
        self.stopped = False  # the stopping criterion ended every row: generate() stops

    def _is_new_call(self, input_ids: torch.Tensor, appended: bool) -> bool:
        if not self.seqs or self.stopped:
            return True
        batch, length = input_ids.shape
        if appended and batch != len(self.seqs) and length == self.length + 1:
            # The criterion judging other rows than the processor masked, one token on:
            # generate()'s beam search hands it every beam's candidates.
            raise ValueError(BEAM_SEARCH)
        if batch != len(self.seqs) or not self.length <= length <= self.length + 1:
            return True
        assert self._ids is not None
        before, seen = input_ids[:, : self.length], self._ids[:, : self.length]
        if torch.equal(before, seen):
            return False
        if batch > 1 and all(any(torch.equal(row, old) for old in seen) for row in before):
            # Every row is one of the tracked rows, moved: beams reordered mid-generation.
            raise ValueError(BEAM_SEARCH)
        return True

    def _start(self, input_ids: torch.Tensor, appended: bool) -> None:
        batch, length = input_ids.shape
        self.seqs = [ConstraintState(self.table) for _ in range(batch)]
        self.abandoned = [False] * batch
        self.prompt_len = length - 1 if appended else length
        self.length = self.prompt_len
        self.stopped = False

    def sync(self, input_ids: torch.Tensor, appended: bool) -> None:
        """Advance every live row through the tokens appended since the last call.

        `appended` is True for the stopping criterion, which runs after the step's token was
        added. Raises InternalError when a token the mask forbade was appended.
        """
        if self._is_new_call(input_ids, appended):
            self._start(input_ids, appended)
        batch, length = input_ids.shape
        if batch != len(self.seqs):
            raise InternalError(
                f"The batch changed size mid-generation ({len(self.seqs)} -> {batch} rows); "
                "beam search and assisted generation are not supported."
            )
        if length > self.length:
            new = input_ids[:, self.length :].tolist()  # [B, n], usually n == 1
            for b, toks in enumerate(new):
                self._advance_row(b, toks)
        self.length = length
        self._ids = input_ids

    def _advance_row(self, b: int, toks: list[int]) -> None:
        seq = self.seqs[b]
        for tok in toks:
            if self.done(b):
                return  # generate() pads finished rows; those tokens are not ours
            try:
                seq.advance(tok, self.tokens_left(b))
            except InternalError:
                if tok != self.pad_token_id:
                    raise
                # Another stopping criterion ended this row and generate() padded it.
                self.abandoned[b] = True

    def tokens_left(self, b: int) -> int:
        """Row `b`'s budget for its next token: HF counts every generated token."""
        return self.max_new_tokens - self.seqs[b].num_tokens

    def done(self, b: int) -> bool:
        """Whether row `b` has ended: EOS, nothing left to add, or stopped by another
        criterion. Once true it stays true."""
        return self.abandoned[b] or self.seqs[b].must_stop(self.tokens_left(b))

    def end_token(self, b: int) -> int:
        """The token an ended row `b` is given: EOS, or padding once EOS is out."""
        seq = self.seqs[b]
        return self.pad_token_id if seq.finished or self.abandoned[b] else self.table.eos_token_id

    def bitmask(self, batch: int) -> torch.Tensor:
        if self._bitmask is None or self._bitmask.shape[0] < batch:
            self._bitmask = allocate_bitmask(batch, self.table.vocab_size)
        return self._bitmask[:batch]


class ConstraintLogitsProcessor(LogitsProcessor):
    """Masks each row's scores to the tokens its constraint and remaining budget allow."""

    def __init__(self, rows: RowStates, policy: BudgetPolicy | None = None) -> None:
        self.rows = rows
        self.policy = policy

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = self.rows
        rows.sync(input_ids, appended=False)
        ended = [b for b in range(len(rows.seqs)) if rows.done(b)]
        masks = [
            MaskRow.free()  # an ended row: its one token is forced below
            if b in ended
            else MaskRow(seq, rows.tokens_left(b), rows.max_new_tokens, self.policy)
            for b, seq in enumerate(rows.seqs)
        ]
        mask_rows(scores, rows.bitmask(scores.shape[0]), masks, rows.table.vocab_size)
        if ended:
            # An ended row gets exactly one token, finite whatever earlier processors did:
            # EOS if it has not emitted it (so it stops even without the stopping
            # criterion), else the padding generate() appends to finished rows.
            forced = [rows.end_token(b) for b in ended]
            idx = torch.tensor(ended, device=scores.device)
            scores[idx] = -torch.inf
            scores[idx, torch.tensor(forced, device=scores.device)] = 0.0
        # A processor before this one (min_new_tokens, suppress_tokens, bad_words_ids) may have
        # put -inf on every token the constraint allows: sampling would then return garbage.
        finite = scores.amax(dim=-1) > -torch.inf  # [B]; False for NaN too
        if not bool(finite.all()):
            rows_hit = torch.nonzero(~finite).flatten().tolist()
            raise InternalError(
                f"Rows {rows_hit} have no token left with a finite score: another logits "
                "processor (min_new_tokens, suppress_tokens, bad_words_ids?) removed every "
                "token the constraint allows. Drop that option when generating with a "
                "constraint."
            )
        return scores


class ConstraintStoppingCriteria(StoppingCriteria):
    """Stops a row once it is accepting and its budget is spent, EOS was emitted, or no
    token could continue it."""

    def __init__(self, rows: RowStates) -> None:
        self.rows = rows

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        rows = self.rows
        rows.sync(input_ids, appended=True)
        done = [rows.done(b) for b in range(len(rows.seqs))]
        rows.stopped = all(done)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)
