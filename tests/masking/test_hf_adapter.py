"""The transformers adapter, driven by a tiny random Llama and the embedded model's tokenizer."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from outlines_core.json_schema import build_regex_from_schema
from outlines_tables import table_from_regex

from gclm.errors import BudgetTooSmallError, InternalError

transformers = pytest.importorskip("transformers")
from gclm.masking.graceful import GracefulPolicy  # noqa: E402
from gclm.masking.hf import HFConstraint, create_constraint  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def allowed_columns(scores):
    return [torch.nonzero(torch.isfinite(row)).flatten().tolist() for row in scores]


def test_new_generation_is_detected_without_generate():
    # Language "ab" over a=0, b=1, EOS=2; prompts use id 3. Called by hand, as a custom
    # decoding loop would: the tokens alone tell one generation from the next.
    from dfa_strategies import table_from_edges

    c = HFConstraint.from_table(table_from_edges(4, 2, 3, [2], [(0, 0, 1), (1, 1, 2)]), 3)
    proc, crit = c.logits_processor, c.stopping_criteria
    ids = torch.full((2, 2), 3)
    assert allowed_columns(proc(ids, torch.zeros(2, 4))) == [[0], [0]]
    ids = torch.cat([ids, torch.zeros(2, 1, dtype=torch.long)], dim=1)
    assert crit(ids, None).tolist() == [False, False]
    assert allowed_columns(proc(ids, torch.zeros(2, 4))) == [[1], [1]]
    ids = torch.cat([ids, torch.ones(2, 1, dtype=torch.long)], dim=1)
    assert crit(ids, None).tolist() == [True, True]
    # A batch of another size starts over.
    assert allowed_columns(proc(torch.full((1, 5), 3), torch.zeros(1, 4))) == [[0]]
    ids = torch.cat([torch.full((1, 5), 3), torch.zeros(1, 1, dtype=torch.long)], dim=1)
    assert crit(ids, None).tolist() == [False]
    # Same shape as the last call but other tokens: a new prompt, not a continuation.
    assert allowed_columns(proc(torch.full((1, 6), 3), torch.zeros(1, 4))) == [[0]]
    assert c.rows.prompt_len == 6


def test_a_generation_the_criterion_ended_is_not_continued():
    # The next call's prompt is the last one's output, one token longer: a continuation in
    # shape, but the criterion ended every row, so generate() had stopped.
    from dfa_strategies import table_from_edges

    c = HFConstraint.from_table(table_from_edges(4, 2, 3, [2], [(0, 0, 1), (1, 1, 2)]), 3)
    proc, crit = c.logits_processor, c.stopping_criteria
    ids = torch.full((1, 2), 3)
    for token in (0, 1):
        proc(ids, torch.zeros(1, 4))
        ids = torch.cat([ids, torch.full((1, 1), token)], dim=1)
        crit(ids, None)
    assert c.rows.stopped
    assert allowed_columns(proc(ids, torch.zeros(1, 4))) == [[0]]  # "ab" again, from the start
    assert c.rows.prompt_len == 4 and not c.rows.stopped


def test_beams_reordered_mid_generation_are_refused():
    from dfa_strategies import table_from_edges

    c = HFConstraint.from_table(table_from_edges(4, 2, 3, [2], [(0, 0, 1), (1, 1, 2)]), 3)
    proc, crit = c.logits_processor, c.stopping_criteria
    ids = torch.tensor([[3, 3], [3, 2]])  # two rows, two prompts
    proc(ids, torch.zeros(2, 4))
    ids = torch.cat([ids, torch.zeros(2, 1, dtype=torch.long)], dim=1)
    crit(ids, None)
    with pytest.raises(ValueError, match="Beam search"):
        proc(ids[[1, 0]], torch.zeros(2, 4))  # the same rows, swapped


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # The model is tiny: thread hand-offs cost more than they save, badly so on a busy CPU.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer(embedded_tokenizer):
    assert embedded_tokenizer.padding_side == "left"
    return embedded_tokenizer


@pytest.fixture(scope="module")
def vocab(embedded_vocab):
    return embedded_vocab


@pytest.fixture(scope="module")
def model(tokenizer, tiny_llama):
    return tiny_llama(
        vocab_size=len(tokenizer) + 64,  # a padded output layer, like real checkpoints
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


@pytest.fixture(scope="module")
def schema_table(vocab):
    return table_from_regex(build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?"), vocab)


def generate(model, tokenizer, prompts, constraint, max_new_tokens, **kwargs):
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            logits_processor=constraint.logits_processor,
            stopping_criteria=constraint.stopping_criteria,
            pad_token_id=tokenizer.pad_token_id,
            **kwargs,
        )
    rows = []
    for row in out[:, inputs["input_ids"].shape[1] :].tolist():
        eos = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
        rows.append(row[:eos])
    return rows


def decode(vocab, ids):
    return vocab.decode(ids)


PROMPTS = ["JSON:", "Here is a much longer prompt, so that the first row is left padded:"]


@pytest.mark.parametrize("sampling", [False, True])
def test_generate_is_valid_within_budget(model, tokenizer, vocab, schema_table, sampling):
    c = HFConstraint.from_table(schema_table, 24, pad_token_id=tokenizer.pad_token_id)
    kwargs = {"do_sample": True, "top_k": 0, "temperature": 1.5} if sampling else {}
    for ids in generate(model, tokenizer, PROMPTS, c, 24, **kwargs):
        assert len(ids) <= 24
        jsonschema.validate(json.loads(decode(vocab, ids)), SCHEMA)


@pytest.mark.parametrize("extra", range(6))
def test_graceful_policy_keeps_outputs_valid_within_budget(
    model, tokenizer, vocab, schema_table, extra
):
    budget = schema_table.min_tokens + extra
    policy = GracefulPolicy.for_vocab(vocab.token_bytes)
    c = HFConstraint.from_table(
        schema_table, budget, pad_token_id=tokenizer.pad_token_id, policy=policy
    )
    kwargs = {"do_sample": True, "top_k": 0, "temperature": 1.5}
    for ids in generate(model, tokenizer, PROMPTS * 2, c, budget, **kwargs):
        assert len(ids) <= budget
        jsonschema.validate(json.loads(decode(vocab, ids)), SCHEMA)


def test_create_constraint_checks_its_policy_name(tokenizer):
    with pytest.raises(ValueError, match="budget_policy must be one of graceful, none"):
        create_constraint(tokenizer, {"regex": "a+"}, 8, budget_policy="eager")
    c = create_constraint(tokenizer, {"regex": "a+"}, 8, budget_policy="none")
    assert c.logits_processor[0].policy is None
    assert create_constraint(tokenizer, {"regex": "a+"}, 8).logits_processor[0].policy


def test_tightest_budget_gives_the_shortest_output(model, tokenizer, vocab, schema_table):
    n = schema_table.min_tokens
    c = HFConstraint.from_table(schema_table, n, pad_token_id=tokenizer.pad_token_id)
    for ids in generate(model, tokenizer, PROMPTS, c, n, do_sample=True):
        assert len(ids) == n
        jsonschema.validate(json.loads(decode(vocab, ids)), SCHEMA)


def test_budget_too_small_is_refused_before_generation(schema_table):
    with pytest.raises(BudgetTooSmallError) as err:
        HFConstraint.from_table(schema_table, schema_table.min_tokens - 1)
    assert err.value.param == "max_new_tokens"


def test_reuse_across_generate_calls(model, tokenizer, vocab, schema_table):
    # The second call's prompt is shorter than the first call's final length: the prompt
    # length must be taken afresh, not kept from the first call.
    c = HFConstraint.from_table(schema_table, 20, pad_token_id=tokenizer.pad_token_id)
    for prompts in (PROMPTS, ["{"], PROMPTS[::-1] + ["three rows now"]):
        rows = generate(model, tokenizer, prompts, c, 20, do_sample=True)
        assert len(rows) == len(prompts)
        for ids in rows:
            assert len(ids) <= 20
            jsonschema.validate(json.loads(decode(vocab, ids)), SCHEMA)


def test_processor_alone_still_ends_valid(model, tokenizer, vocab):
    table = table_from_regex(r"(ab|cd)+", vocab)
    c = HFConstraint.from_table(table, 9, pad_token_id=tokenizer.pad_token_id)
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=9,
            logits_processor=c.logits_processor,
            do_sample=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    for row in out[:, inputs["input_ids"].shape[1] :].tolist():
        ids = row[: row.index(2)] if 2 in row else row
        text = decode(vocab, ids)
        assert text and len(text) % 2 == 0 and set(text[::2]) <= {"a", "c"}, text


def test_beam_search_is_refused(model, tokenizer, schema_table):
    c = HFConstraint.from_table(schema_table, 20, pad_token_id=tokenizer.pad_token_id)
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="Beam search"):
        c.generate(model, **inputs, num_beams=2)
    config = transformers.GenerationConfig(num_beams=3, max_new_tokens=20)
    with pytest.raises(ValueError, match="Beam search"):
        c.generate(model, **inputs, generation_config=config)
    # Handed to generate() directly, the processor and criterion see beams by their tokens
    # (reordered rows, or the criterion shown every beam's candidates), at the second step.
    with pytest.raises(ValueError, match="Beam search"):
        generate(model, tokenizer, PROMPTS, c, 20, num_beams=2)
    processor_only = HFConstraint.from_table(schema_table, 20, tokenizer.pad_token_id)
    processor_only.stopping_criteria = transformers.StoppingCriteriaList()
    with pytest.raises(ValueError, match="Beam search"):
        generate(model, tokenizer, PROMPTS, processor_only, 20, num_beams=2)


def test_generate_budget_below_constraint_budget_is_refused(model, tokenizer, schema_table):
    c = HFConstraint.from_table(schema_table, 30, pad_token_id=tokenizer.pad_token_id)
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with pytest.raises(ValueError, match="Pass the same max_new_tokens"):
        c.generate(model, **inputs, max_new_tokens=20)


def test_generate_through_the_constraint(model, tokenizer, vocab, schema_table):
    c = HFConstraint.from_table(schema_table, 20, pad_token_id=tokenizer.pad_token_id)
    inputs = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    for _ in range(2):  # reused, as generate() calls are
        with torch.no_grad():
            out = c.generate(model, **inputs, do_sample=True, pad_token_id=tokenizer.pad_token_id)
        for row in out[:, inputs["input_ids"].shape[1] :].tolist():
            eos = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
            assert eos <= 20
            jsonschema.validate(json.loads(decode(vocab, row[:eos])), SCHEMA)


@pytest.mark.parametrize("sampling", [False, True])
def test_create_constraint_end_to_end(model, tokenizer, vocab, sampling):
    pytest.importorskip("gclm.compiler.whole.compile")
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    c = create_constraint(tokenizer, rf, max_new_tokens=24)
    assert c.min_tokens > 0
    kwargs = {"do_sample": True} if sampling else {}
    for ids in generate(model, tokenizer, PROMPTS, c, 24, **kwargs):
        assert len(ids) <= 24
        jsonschema.validate(json.loads(decode(vocab, ids)), SCHEMA)
    with pytest.raises(BudgetTooSmallError):
        create_constraint(tokenizer, rf, max_new_tokens=c.min_tokens - 1)


@pytest.mark.parametrize("regex", ["ab", "(ab)+"])
def test_rows_that_ended_survive_min_new_tokens(model, tokenizer, vocab, regex):
    # min_new_tokens puts -inf on EOS; a row that has ended still gets a finite token.
    c = HFConstraint.from_table(table_from_regex(regex, vocab), 8, tokenizer.pad_token_id)
    for ids in generate(model, tokenizer, PROMPTS, c, 8, min_new_tokens=5, do_sample=True):
        text = decode(vocab, ids)
        assert text.startswith("ab") and set(text) <= {"a", "b"}


def test_processor_that_removes_every_allowed_token_is_reported(model, tokenizer, vocab):
    table = table_from_regex("ab", vocab)
    first = table.transitions(table.initial)[0].tolist()  # every token that can start "ab"
    c = HFConstraint.from_table(table, 8, tokenizer.pad_token_id)
    with pytest.raises(InternalError, match="no token left with a finite score"):
        generate(model, tokenizer, PROMPTS, c, 8, suppress_tokens=first)
