"""gclm's budget-aware mask inside vLLM: the masking half of its v1 logits processor.

The processor vLLM loads is `gclm.server.engine.vllm_processor:GclmLogitsProcessor`, which
finds the tables (the served tokenizer's vocabulary, gclm's table cache, the compile
workers) and hands them here; this module turns tables, per-row state and budget into masks.

A request opts in with `SamplingParams.extra_args["gclm"]` (the OpenAI body's `vllm_xargs`):
any constraint `gclm.compiler.front.constraint.parse_constraint` reads (`{"json": schema}`,
`{"regex": ...}`, `{"choice": [...]}`, a `response_format` dict), as a dict or as JSON text
(`vllm_xargs` only carries strings and numbers). Its output is then accepted by the
constraint and at most `max_tokens` tokens long, EOS excluded; a budget below the shortest
output is refused by `check_request` (the processor's `validate_params`), which vLLM answers
with a 400 naming the minimum. When the budget is tight, the graceful policy paces the spare
tokens over the output (masking/graceful.py), as on gclm's own engine;
`"gclm_budget_policy": "none"` leaves the budget-aware mask alone. Rows are masked by
`gclm.masking.apply.mask_rows`, the step every gclm engine uses.

A reasoning model's request thinks first with `extra_args["gclm_thinking"]`, JSON
`{"end_ids": [...], "cap": n | null}` (the end marker's token ids, the thinking cap): its row
is a ReasoningState (masking/reasoning.py), free text until the marker, then the constraint,
the marker forced where the budget leaves only the marker plus the answer's minimum; the
request's stop token ids are banned while it thinks. `check_request` then asks for the
marker plus the answer's minimum.

Budget: vLLM counts EOS against `max_tokens` and gclm does not, and the row that has used
`k` tokens is given `min(max_tokens, max_model_len - prompt) - k` tokens for the one being
sampled, EOS allowed only where the output is complete. An output that is complete and has
spent its budget is cut by vLLM with finish_reason "length"; gclm's own server reports
"stop" for it (`gclm serve --engine vllm`).

Options that would break the guarantee are refused with a constraint: `min_tokens` (it
bans EOS where the mask may allow only EOS), `ignore_eos`, `stop` strings and `bad_words`
(they cut or censor a constrained output), and vLLM's own `structured_outputs`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from gclm.compiler import CompiledTable, Constraint, TokenVocabulary, parse_constraint
from gclm.errors import ConstraintError, GclmError, InternalError, cut
from gclm.masking.apply import MaskRow, mask_rows
from gclm.masking.bitmask import allocate_bitmask
from gclm.masking.graceful import POLICY_NAMES, GracefulPolicy
from gclm.masking.policy import BudgetPolicy
from gclm.masking.reasoning import ReasoningState, ThinkingSpec
from gclm.masking.state import ConstraintState, check_budget

if TYPE_CHECKING:
    from vllm import SamplingParams

# The key of SamplingParams.extra_args (and of vllm_xargs) that carries the constraint.
EXTRA_ARGS_KEY = "gclm"
# Optional: 0/false gives the forward-only DFA mask without the budget (comparisons only).
BUDGET_AWARE_KEY = "gclm_budget_aware"
# Optional: the budget policy (masking/graceful.py), "graceful" (the default) or "none".
POLICY_KEY = "gclm_budget_policy"
# Optional: a thinking phase before the constraint, {"end_ids": [...], "cap": n | null}.
THINKING_KEY = "gclm_thinking"


def request_constraint(params: SamplingParams) -> tuple[Constraint, bool] | None:
    """The request's constraint and whether it is budget-aware, or None without one.

    Raises:
        ConstraintError: the value under "gclm" is not a constraint (param "gclm..."), or
            the budget policy is not one of POLICY_NAMES.
    """
    extra = params.extra_args or {}
    spec = extra.get(EXTRA_ARGS_KEY)
    if spec is None:
        return None
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ConstraintError(
                f"extra_args[{EXTRA_ARGS_KEY!r}] must be a constraint as JSON text, such as "
                f'\'{{"json": {{...}}}}\' or \'{{"regex": "..."}}\'; it is not JSON: {e}.',
                param=EXTRA_ARGS_KEY,
            ) from None
    try:
        constraint = parse_constraint(spec)
    except ConstraintError as e:
        e.param = f"{EXTRA_ARGS_KEY}.{e.param}" if e.param else EXTRA_ARGS_KEY
        raise
    aware = extra.get(BUDGET_AWARE_KEY, True)
    if isinstance(aware, str):
        aware = aware.strip().lower() not in ("0", "false", "no")
    request_policy(params)
    return constraint, bool(aware)


def request_thinking(params: SamplingParams) -> ThinkingSpec | None:
    """The request's thinking phase (extra_args["gclm_thinking"]), or None.

    Raises ConstraintError (param "gclm_thinking") for a value that is not
    `{"end_ids": [token ids], "cap": n | null}`.
    """
    value = (params.extra_args or {}).get(THINKING_KEY)
    if value is None:
        return None
    try:
        if isinstance(value, str):
            value = json.loads(value)
        ids, cap = value["end_ids"], value.get("cap")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise TypeError("end_ids must be a list of token ids")
        if cap is not None and not isinstance(cap, int):
            raise TypeError("cap must be an integer or null")
        return ThinkingSpec(tuple(ids), cap)
    except (json.JSONDecodeError, TypeError, KeyError, AttributeError, ValueError) as e:
        raise ConstraintError(
            f'extra_args[{THINKING_KEY!r}] must be JSON {{"end_ids": [token ids], "cap": '
            f"n or null}}: {cut(str(e), 120)}.",
            param=THINKING_KEY,
        ) from None


def request_policy(params: SamplingParams) -> str:
    """The request's budget policy name (POLICY_NAMES; "graceful" unless it says).

    Raises ConstraintError for another name."""
    name = (params.extra_args or {}).get(POLICY_KEY, POLICY_NAMES[0])
    if name not in POLICY_NAMES:
        raise ConstraintError(
            f"extra_args[{POLICY_KEY!r}] must be one of {', '.join(POLICY_NAMES)}, got "
            f"{cut(str(name), 80)!r}.",
            param=POLICY_KEY,
        )
    return str(name)


def refuse_conflicts(params: SamplingParams) -> None:
    """Raise ValueError for a sampling option that would break a constrained output."""
    conflicts = {
        "min_tokens": bool(params.min_tokens),
        "ignore_eos": params.ignore_eos,
        "stop": bool(params.stop),
        "bad_words": bool(params.bad_words),
        "structured_outputs": params.structured_outputs is not None,
    }
    bad = [name for name, hit in conflicts.items() if hit]
    if bad:
        raise ValueError(
            f"{', '.join(bad)} cannot be combined with a gclm constraint (vllm_xargs "
            f"{EXTRA_ARGS_KEY!r}): it would cut off, censor or replace the constrained output. "
            "Remove it; the constraint itself decides where the output ends."
        )


class Tables(Protocol):
    """The served tokenizer's vocabulary and its compiled tables (the processor's
    TableSource, server/engine/vllm_processor.py)."""

    vocab: TokenVocabulary

    def table(self, constraint: Constraint) -> CompiledTable:
        """The constraint's whole table, its mask rows built. Raises ConstraintError."""
        ...


def check_request(params: SamplingParams, tables: Callable[[], Tables]) -> None:
    """Parse and compile the request's constraint and check its budget (vLLM's frontend);
    `tables` is asked only for a request with a constraint.

    Raises:
        ValueError: gclm's message (vLLM answers 400): a bad constraint or thinking spec,
            a conflicting option, or a max_tokens below the constraint's minimum (after
            the end of thinking, for a request that thinks first; the message names it).
    """
    try:
        found = request_constraint(params)
        if found is None:
            return
        constraint, budget_aware = found
        thinking = request_thinking(params)
        refuse_conflicts(params)
        table = tables().table(constraint)
        if budget_aware and params.max_tokens is not None:
            check_budget(table, params.max_tokens, thinking=thinking)
        if thinking is not None:  # the marker's checks, here rather than in the engine core
            ReasoningState(table, thinking, budget_aware, params.all_stop_token_ids)
    except GclmError as e:
        raise ValueError(e.message) from e
    except ValueError as e:
        raise ValueError(f"extra_args[{THINKING_KEY!r}]: {e}") from e


# --- the batch: rows follow their outputs, masks applied ---


@dataclass(eq=False)
class _Row:
    """One constrained request in vLLM's persistent batch."""

    state: ConstraintState
    output: list[int]  # vLLM's live list of the request's output tokens
    budget: int  # min(max_tokens, room left in the context)
    policy: BudgetPolicy | None  # reweights the masked logits (None: the mask alone)
    synced: int = 0  # output tokens already fed to `state`

    def sync(self) -> None:
        """Advance the DFA through the tokens sampled since the last step."""
        output, state = self.output, self.state
        while self.synced < len(output):
            state.advance(output[self.synced], self.budget - self.synced)
            self.synced += 1

    @property
    def tokens_left(self) -> int:
        return self.budget - len(self.output)

    def mask_row(self) -> MaskRow:
        """This step's MaskRow (after `sync`)."""
        return MaskRow(self.state, self.tokens_left, self.budget, self.policy)


class ConstraintBatch:
    """The constrained rows of vLLM's persistent batch: each row's state follows its output
    tokens (`update_state` takes vLLM's BatchUpdate), and `apply` masks them to the tokens
    their constraint and remaining budget allow. Rows without `extra_args["gclm"]` are left
    untouched.

    Args:
        tables: the served tokenizer's vocabulary and tables.
        max_model_len: vLLM's context length (a row's budget is at most what is left of it).
        max_rows: vLLM's max_num_seqs (the bitmask's rows).
    """

    def __init__(self, tables: Tables, max_model_len: int, max_rows: int) -> None:
        self.tables = tables
        self.max_model_len = max_model_len
        self.bitmask = allocate_bitmask(max_rows, tables.vocab.size)  # [max_rows, W]
        self.rows: dict[int, _Row] = {}  # batch index -> row
        self._graceful: GracefulPolicy | None = None  # built on the first row that asks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._new_row)

    def _new_row(
        self, params: SamplingParams, prompt: list[int] | None, output: list[int]
    ) -> _Row | None:
        found = request_constraint(params)
        if found is None:
            return None
        constraint, budget_aware = found
        table = self.tables.table(constraint)
        budget = self.max_model_len - len(prompt) if prompt is not None else self.max_model_len
        if params.max_tokens is not None:
            budget = min(budget, params.max_tokens)
        thinking = request_thinking(params)
        need = table.min_tokens if thinking is None else thinking.min_tokens(table)
        if budget_aware and budget < need:
            raise InternalError(
                f"A request reached the sampler with a budget of {budget} tokens, below its "
                f"constraint's minimum of {need}: check_request did not run."
            )
        state: ConstraintState
        if thinking is None:
            state = ConstraintState(table, budget_aware=budget_aware)
        else:  # a stop token while thinking would end the request before its answer
            state = ReasoningState(table, thinking, budget_aware, params.all_stop_token_ids)
        return _Row(state, output, budget, self._policy(request_policy(params)))

    def _policy(self, name: str) -> BudgetPolicy | None:
        if name != "graceful":
            return None
        if self._graceful is None:
            self._graceful = GracefulPolicy.for_vocab(self.tables.vocab.token_bytes)
        return self._graceful

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the constrained rows of `logits` [B, V_logits] in place."""
        if not self.rows:
            return logits
        indices = sorted(self.rows)
        rows = []
        for index in indices:
            row = self.rows[index]
            row.sync()
            rows.append(row.mask_row())
        count, size = len(indices), self.tables.vocab.size
        if indices[-1] == count - 1 == logits.shape[0] - 1:  # every row: mask in place
            mask_rows(logits, self.bitmask, rows, size)
            return logits
        where = torch.tensor(indices, device=logits.device)
        part = logits[where]  # [count, V_logits], a copy
        mask_rows(part, self.bitmask, rows, size)
        logits[where] = part
        return logits


def sampling_extra_args(
    constraint: Mapping[str, Any] | Constraint, thinking: ThinkingSpec | None = None
) -> dict[str, str]:
    """`extra_args` / `vllm_xargs` that ask GclmLogitsProcessor for `constraint` (after
    `thinking`, for a request that thinks first)."""
    if isinstance(constraint, Constraint):
        spec: Any = constraint.as_spec()
    else:
        spec = dict(constraint)
    extra = {EXTRA_ARGS_KEY: json.dumps(spec, ensure_ascii=False)}
    if thinking is not None:
        extra[THINKING_KEY] = json.dumps({"end_ids": list(thinking.end_ids), "cap": thinking.cap})
    return extra
