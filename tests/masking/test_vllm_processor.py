"""GclmLogitsProcessor (server/engine/vllm_processor.py over masking/vllm.py) against
hand-made vLLM batch updates, on the embedded tokenizer; how its frontend is told the
tokenizer.

The constraint is two digits (each digit is one token in SmolLM2's vocabulary), so the
expected mask of every step is known exactly: digits, digits, then EOS only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

if os.environ.get("GCLM_REQUIRE_VLLM") != "1":
    pytest.importorskip("vllm")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from gclm.masking import vllm as gv  # noqa: E402
from gclm.server.engine import vllm_processor as vp  # noqa: E402
from gclm.server.engine.model_loader import embedded_model_dir  # noqa: E402

pytestmark = pytest.mark.vllm

TWO_DIGITS = {"regex": "[0-9]{2}"}


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vp.GclmLogitsProcessor]:
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            tokenizer=str(embedded_model_dir()), tokenizer_revision=None, max_model_len=64
        ),
        scheduler_config=SimpleNamespace(max_num_seqs=4),
    )
    with pytest.MonkeyPatch.context() as mp:  # tables start cold, in a directory of their own
        mp.setenv("GCLM_CACHE_DIR", str(tmp_path_factory.mktemp("gclm-cache")))
        proc = vp.GclmLogitsProcessor(config, torch.device("cpu"), False)  # type: ignore[arg-type]
    vp.GclmLogitsProcessor.serve_frontend(proc.source)
    yield proc
    vp.GclmLogitsProcessor.serve_frontend(None)


@pytest.fixture(scope="module")
def digits(processor: vp.GclmLogitsProcessor) -> set[int]:
    data = processor.source.vocab.token_bytes
    return {i for i, b in enumerate(data) if b is not None and len(b) == 1 and b.isdigit()}


def params(max_tokens: int, constraint: dict | None = TWO_DIGITS, **kw: object) -> SamplingParams:
    extra = gv.sampling_extra_args(constraint) if constraint is not None else None
    return SamplingParams(max_tokens=max_tokens, extra_args=extra, **kw)


def allowed(logits: torch.Tensor, row: int) -> set[int]:
    return set(torch.nonzero(torch.isfinite(logits[row])).flatten().tolist())


def step(proc: vp.GclmLogitsProcessor, batch: int, update: BatchUpdate | None) -> torch.Tensor:
    proc.update_state(update)
    return proc.apply(torch.zeros(batch, 49152))


def test_rows_follow_output_tokens_adds_moves_and_removes(
    processor: vp.GclmLogitsProcessor, digits: set[int]
) -> None:
    eos = processor.source.vocab.eos_token_id
    out0: list[int] = []
    out1: list[int] = []
    added = [(0, params(2), [1, 2, 3], out0), (1, params(5, None), [1, 2], out1)]
    logits = step(processor, 2, BatchUpdate(2, [], added, []))
    assert allowed(logits, 0) == digits
    assert len(allowed(logits, 1)) == 49152  # unconstrained: untouched

    out0.append(min(digits))
    out1.append(42)
    logits = step(processor, 2, None)
    assert allowed(logits, 0) == digits  # one token left after this one: one more digit

    # Swap the rows: the constrained one is now row 1.
    out0.append(min(digits))
    logits = step(processor, 2, BatchUpdate(2, [], [], [(0, 1, MoveDirectionality.SWAP)]))
    assert allowed(logits, 1) == {eos}  # complete, budget spent: only EOS
    assert len(allowed(logits, 0)) == 49152

    # The unconstrained request leaves; the constrained one moves down to row 0.
    move = (1, 0, MoveDirectionality.UNIDIRECTIONAL)
    logits = step(processor, 1, BatchUpdate(1, [0], [], [move]))
    assert allowed(logits, 0) == {eos}

    step(processor, 0, BatchUpdate(0, [0], [], []))
    assert processor.batch.rows == {}


def test_context_room_bounds_the_budget(
    processor: vp.GclmLogitsProcessor, digits: set[int]
) -> None:
    """A prompt that leaves 2 tokens of context: the row must finish in 2, whatever
    max_tokens says."""
    out: list[int] = []
    prompt = list(range(62))  # max_model_len is 64
    logits = step(processor, 1, BatchUpdate(1, [], [(0, params(50), prompt, out)], []))
    assert allowed(logits, 0) == digits
    out.append(min(digits))
    logits = step(processor, 1, None)
    assert allowed(logits, 0) == digits
    step(processor, 0, BatchUpdate(0, [0], [], []))


def test_validate_params_names_the_minimum(processor: vp.GclmLogitsProcessor) -> None:
    with pytest.raises(ValueError, match=r"Set max_tokens to at least 2\."):
        vp.GclmLogitsProcessor.validate_params(params(1))
    vp.GclmLogitsProcessor.validate_params(params(2))
    vp.GclmLogitsProcessor.validate_params(params(1, None))  # no constraint: nothing to check


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"min_tokens": 1}, "min_tokens"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"stop": ["x"]}, "stop"),
    ],
)
def test_validate_params_refuses_conflicts(
    processor: vp.GclmLogitsProcessor, kw: dict, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        vp.GclmLogitsProcessor.validate_params(params(8, **kw))


def test_validate_params_refuses_bad_constraints(processor: vp.GclmLogitsProcessor) -> None:
    bad = SamplingParams(max_tokens=8, extra_args={"gclm": "{nope"})
    with pytest.raises(ValueError, match="not JSON"):
        vp.GclmLogitsProcessor.validate_params(bad)
    with pytest.raises(ValueError, match="Unknown constraint key .lark."):
        vp.GclmLogitsProcessor.validate_params(params(8, {"lark": 'start: "x"'}))


def test_the_graceful_policy_runs_in_vllm_unless_a_request_turns_it_off(
    processor: vp.GclmLogitsProcessor,
) -> None:
    """A string opened with 5 tokens left: closing it at once would leave its spare tokens
    unspent, and the graceful policy lowers the closing quote, as on gclm's own engine; the
    same row asking for "none" keeps the plain budget-aware mask (allowed logits untouched)."""
    quote = processor.source.vocab.token_bytes.index(b'"')
    text = {"json": {"type": "string"}}
    off = {**params(6, text).extra_args, gv.POLICY_KEY: "none"}
    added = [
        (0, params(6, text), [1], [quote]),  # the opening quote is already out
        (1, SamplingParams(max_tokens=6, extra_args=off), [1], [quote]),
    ]
    logits = step(processor, 2, BatchUpdate(2, [], added, []))
    assert allowed(logits, 0) == allowed(logits, 1) and quote in allowed(logits, 0)
    plain = logits[1][torch.isfinite(logits[1])]
    assert bool((plain == 0).all()), "policy 'none' must leave the mask alone"
    assert logits[0, quote] < 0, "the graceful policy did not lower the closing quote"
    step(processor, 0, BatchUpdate(0, [0, 1], [], []))
    with pytest.raises(ValueError, match="gclm_budget_policy"):
        vp.GclmLogitsProcessor.validate_params(
            SamplingParams(max_tokens=6, extra_args={**off, gv.POLICY_KEY: "eager"})
        )


# --- a thinking phase before the constraint (extra_args["gclm_thinking"]) ---


@pytest.fixture(scope="module")
def marker(embedded_tokenizer) -> tuple[int, ...]:
    ids = tuple(embedded_tokenizer.encode("</think>", add_special_tokens=False))
    assert len(ids) == 3 and len(set(ids)) == 3  # plain text: three distinct tokens
    return ids


def thinking(max_tokens: int, end_ids: tuple[int, ...], cap: int | None = None, **kw: object):
    from gclm.masking.reasoning import ThinkingSpec

    extra = gv.sampling_extra_args(TWO_DIGITS, ThinkingSpec(end_ids, cap))
    return SamplingParams(max_tokens=max_tokens, extra_args=extra, **kw)


def test_thinking_rows_think_then_close_at_the_edge_then_answer(
    processor: vp.GclmLogitsProcessor, digits: set[int], marker: tuple[int, ...]
) -> None:
    """Two digits after a 3-token marker, 6 tokens: one free token (not EOS nor a stop
    token), then the marker forced token by token, then exactly the two digits, then EOS."""
    eos, stop = processor.source.vocab.eos_token_id, 42
    out: list[int] = []
    added = [(0, thinking(6, marker, stop_token_ids=[stop]), [1, 2], out)]
    logits = step(processor, 1, BatchUpdate(1, [], added, []))
    free = allowed(logits, 0)
    assert free == set(range(49152)) - {eos, stop}  # thinking: anything but ending
    out.append(min(digits))  # a thought
    for token in marker:  # 5 tokens left = the marker and the two digits: forced close
        assert allowed(step(processor, 1, None), 0) == {token}
        out.append(token)
    assert allowed(step(processor, 1, None), 0) == digits  # the answer, from its start
    out.append(min(digits))
    assert allowed(step(processor, 1, None), 0) == digits
    out.append(min(digits))
    assert allowed(step(processor, 1, None), 0) == {eos}
    assert processor.batch.rows[0].state.thinking_tokens == 4  # the thought and the marker
    step(processor, 0, BatchUpdate(0, [0], [], []))


def test_a_thinking_cap_closes_before_the_budget_does(
    processor: vp.GclmLogitsProcessor, marker: tuple[int, ...]
) -> None:
    out: list[int] = []
    logits = step(processor, 1, BatchUpdate(1, [], [(0, thinking(40, marker, 0), [1], out)], []))
    assert allowed(logits, 0) == {marker[0]}  # a cap of 0: the marker at once
    step(processor, 0, BatchUpdate(0, [0], [], []))


def test_validate_params_counts_the_marker(
    processor: vp.GclmLogitsProcessor, marker: tuple[int, ...]
) -> None:
    with pytest.raises(ValueError, match=r"Set max_tokens to at least 5\."):
        vp.GclmLogitsProcessor.validate_params(thinking(4, marker))
    vp.GclmLogitsProcessor.validate_params(thinking(5, marker))
    eos = processor.source.vocab.eos_token_id
    for bad in (
        '{"cap": 3}',
        '{"end_ids": []}',
        '{"end_ids": ["a"]}',
        "[1",
        f'{{"end_ids": [{eos}]}}',
    ):
        extra = {**gv.sampling_extra_args(TWO_DIGITS), gv.THINKING_KEY: bad}
        with pytest.raises(ValueError, match="gclm_thinking"):
            vp.GclmLogitsProcessor.validate_params(SamplingParams(max_tokens=8, extra_args=extra))


# --- the frontend's tokenizer: given, or named in GCLM_VLLM_TOKENIZER, never guessed ---


def test_an_unknown_tokenizer_refuses_a_constrained_request_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing is read off the caller: vLLM's InputProcessor holds the model config, and
    gclm once walked the stack up to it; now the tokenizer is given or named, or the
    request is refused (vLLM answers 400)."""
    monkeypatch.delenv(vp.TOKENIZER_ENV, raising=False)
    monkeypatch.setattr(vp.GclmLogitsProcessor, "_frontend", None)

    class InputProcessor:  # what calls validate_params in vLLM's frontend
        model_config = SimpleNamespace(tokenizer=str(embedded_model_dir()), tokenizer_revision=None)

        def validate(self, sampling: SamplingParams) -> None:
            vp.GclmLogitsProcessor.validate_params(sampling)

    InputProcessor().validate(params(8, None))  # no constraint: nothing to check
    with pytest.raises(ValueError, match="GCLM_VLLM_TOKENIZER") as refused:
        InputProcessor().validate(params(8))
    assert "gclm serve --engine vllm" in str(refused.value)


def test_a_tokenizer_that_does_not_load_is_a_value_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv(vp.TOKENIZER_ENV, str(tmp_path / "no-such-model"))
    monkeypatch.setattr(vp.GclmLogitsProcessor, "_frontend", None)
    with pytest.raises(ValueError, match="could not load the tokenizer GCLM_VLLM_TOKENIZER="):
        vp.GclmLogitsProcessor.validate_params(params(8))


def test_the_tokenizer_named_in_the_environment_checks_requests(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """A plain vLLM server's frontend: the tokenizer is loaded on the first constrained
    request, its tables compiled in worker processes, and kept for the next ones."""
    monkeypatch.setenv(vp.TOKENIZER_ENV, str(embedded_model_dir()))
    monkeypatch.setenv("GCLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(vp.GclmLogitsProcessor, "_frontend", None)
    with pytest.raises(ValueError, match="max_tokens.* 2"):
        vp.GclmLogitsProcessor.validate_params(params(1))
    source = vp.GclmLogitsProcessor._frontend
    assert source is not None and source.vocab.size == 49152
    try:
        vp.GclmLogitsProcessor.validate_params(params(2))
        assert vp.GclmLogitsProcessor._frontend is source
        assert list((tmp_path / "tables").iterdir())  # compiled into the disk cache
    finally:
        source.close()


def test_a_given_source_is_used_before_the_environment(
    processor: vp.GclmLogitsProcessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(vp.TOKENIZER_ENV, "/no/such/model")
    assert vp.GclmLogitsProcessor.frontend_tables() is processor.source
    vp.GclmLogitsProcessor.validate_params(params(2))
