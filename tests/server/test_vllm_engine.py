"""The vLLM engine's own logic that needs no vLLM: its options, settings and CLI refusals,
and gclm's finish reasons over vLLM's. The engine itself runs in test_e2e_vllm.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.service.cache import TableCache
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import EngineDeadError, InternalError, InvalidRequestError, QueueFullError
from gclm.server.engine.output import OutputTracker
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    PreparedConstraint,
    SamplingParams,
    TokenEvent,
)
from gclm.server.engine.vllm import VllmEngine, VllmOptions, VllmRequest, tracker_reason
from gclm.server.settings import ServerSettings


def test_options_refuse_bad_values() -> None:
    VllmOptions(model="m", served_name="m", tensor_parallel_size=2, prefix_caching=True)
    with pytest.raises(ValueError, match="tensor_parallel_size must be at least 1"):
        VllmOptions(model="m", served_name="m", tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        VllmOptions(model="m", served_name="m", gpu_memory_utilization=1.5)
    with pytest.raises(
        ValueError, match="distributed_executor_backend must be mp, ray, uni or external_launcher"
    ):
        VllmOptions(model="m", served_name="m", distributed_executor_backend="slurm")


def test_settings_read_the_vllm_options_from_the_environment() -> None:
    env = {
        "GCLM_ENGINE": "vllm",
        "GCLM_TENSOR_PARALLEL_SIZE": "4",
        "GCLM_DISTRIBUTED_EXECUTOR_BACKEND": "ray",
        "GCLM_GPU_MEMORY_UTILIZATION": "0.8",
        "GCLM_PREFIX_CACHING": "on",
    }
    s = ServerSettings.from_env(env)
    assert (s.engine, s.tensor_parallel_size, s.distributed_executor_backend) == ("vllm", 4, "ray")
    assert (s.gpu_memory_utilization, s.prefix_caching) == (0.8, "on")
    assert ServerSettings().engine == "transformers"
    with pytest.raises(ValueError, match="engine must be transformers or vllm"):
        ServerSettings(engine="tgi")
    with pytest.raises(ValueError, match="prefix_caching must be auto, on or off"):
        ServerSettings(prefix_caching="yes")


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None,
    reason="vLLM is installed here: the refusal is for environments without it",
)
def test_cli_without_vllm_says_how_to_get_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gclm.server.cli", "serve", "--engine", "vllm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gclm: error: --engine vllm needs vLLM")
    assert "make install-vllm" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def digits_table(embedded_vocab):
    return compile_constraint(Constraint.regex("[0-9]{2}"), embedded_vocab)


def finish_reason(table, tokens: list[int], vllm_reason: str, budget_aware: bool = True) -> str:
    """The finish_reason gclm reports when vLLM ends the output `tokens` with `vllm_reason`."""
    request = GenerationRequest(
        [1, 2],
        SamplingParams(max_tokens=2),
        constraint=PreparedConstraint.of(table, budget_aware=budget_aware),
    )
    sent: list = []
    output = OutputTracker(request, (), sent.append)
    output.take(tokens)
    output.finish(tracker_reason(vllm_reason))
    assert isinstance(sent[-1], FinishEvent)
    return sent[-1].finish_reason


def test_finish_reason_is_gclms(digits_table, embedded_vocab) -> None:
    digit = next(i for i, b in enumerate(embedded_vocab.token_bytes) if b == b"7")
    complete, partial = [digit, digit], [digit]
    # vLLM cut a complete output at max_tokens: complete by construction, so "stop".
    assert finish_reason(digits_table, complete, "length") == "stop"
    # A budget-unaware output cut mid-way stays "length".
    assert finish_reason(digits_table, partial, "length", budget_aware=False) == "length"
    assert finish_reason(digits_table, complete, "stop") == "stop"
    assert finish_reason(digits_table, complete, "abort") == "cancelled"


# --- the engine over a scripted AsyncLLM (vLLM's SamplingParams, no model) ---


class ScriptedLLM:
    """Answers every request with `steps` (token ids, text, finish reason), each after
    `gate` is set when one is given."""

    def __init__(
        self, steps: list[tuple[list[int], str, str | None]], cached_tokens: int = 0
    ) -> None:
        self.steps = steps
        self.cached_tokens = cached_tokens  # vLLM's num_cached_tokens (its prefix cache)
        self.gate: asyncio.Event | None = None
        self.params: list[object] = []
        self.errored = False  # AsyncLLM's: its engine core died
        self.dead_error: BaseException = RuntimeError("EngineCore died")

    async def generate(self, prompt: dict, sampling: object, request_id: str):
        self.params.append(sampling)
        for ids, text, reason in self.steps:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)
            out = SimpleNamespace(token_ids=ids, text=text, finish_reason=reason)
            yield SimpleNamespace(outputs=[out], num_cached_tokens=self.cached_tokens)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def engine(embedded_tokenizer, embedded_vocab, tmp_path):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vLLM's SamplingParams; run `make test-vllm`")
    cache = TableCache(
        lambda c: compile_constraint(c, embedded_vocab),
        embedded_vocab.fingerprint,
        disk_dir=tmp_path,
    )
    options = VllmOptions(model="m", served_name="m", max_num_seqs=1)
    eng = VllmEngine(
        options, embedded_tokenizer, model_id="m", vocab=embedded_vocab, cache=cache, queue_size=1
    )
    eng.context_length = 2048
    yield eng
    eng.shutdown()


async def events(engine: VllmEngine, handle: VllmRequest) -> list:
    return [e async for e in engine.stream(handle)]


@pytest.mark.vllm
def test_constrained_request_cut_at_the_budget_finishes_stop(engine, embedded_vocab) -> None:
    digit = next(i for i, b in enumerate(embedded_vocab.token_bytes) if b == b"7")
    engine._llm = ScriptedLLM([([digit], "7", None), ([digit], "7", "length")], cached_tokens=1)

    async def run() -> list:
        digits = Constraint.regex("[0-9]{2}")
        table = await engine.constraints.compile(digits)
        params = SamplingParams(max_tokens=2, stop=("7",))
        request = GenerationRequest(
            [1, 2], params, constraint=PreparedConstraint.of(table, compiled_from=digits)
        )
        return await events(engine, engine.submit(request))

    got = asyncio.run(run())
    assert [e.text for e in got if isinstance(e, TokenEvent)] == ["7", "7"]
    # The regex closed as the budget ran out: complete, not cut; vLLM's prefix-cache hit.
    assert got[-1] == FinishEvent("stop", 2, 2, cached_tokens=1, budget_cut=False)
    sent = engine._llm.params[0]
    assert sent.stop in (None, []), "a constrained request must not carry stop strings"
    assert json.loads(sent.extra_args["gclm"]) == {"regex": "[0-9]{2}"}


@pytest.mark.vllm
def test_a_token_outside_the_constraint_fails_the_request(engine, embedded_vocab) -> None:
    letter = next(i for i, b in enumerate(embedded_vocab.token_bytes) if b == b"a")
    engine._llm = ScriptedLLM([([letter], "a", "stop")])

    async def run() -> list:
        digits = Constraint.regex("[0-9]{2}")
        table = await engine.constraints.compile(digits)
        request = GenerationRequest(
            [1], SamplingParams(2), constraint=PreparedConstraint.of(table, compiled_from=digits)
        )
        return await events(engine, engine.submit(request))

    got = asyncio.run(run())
    assert isinstance(got[-1], ErrorEvent) and isinstance(got[-1].error, InternalError)


@pytest.mark.vllm
def test_queue_full_is_429_and_cancel_finishes_cancelled(engine) -> None:
    engine._llm = ScriptedLLM([([5], "x", None), ([6], "y", "length")])

    async def run() -> tuple[list, list]:
        engine._llm.gate = asyncio.Event()
        first = engine.submit(GenerationRequest([1], SamplingParams(4)))
        second = engine.submit(GenerationRequest([1], SamplingParams(4)))
        with pytest.raises(QueueFullError):  # max_num_seqs 1 + queue_size 1
            engine.submit(GenerationRequest([1], SamplingParams(4)))
        stats = engine.stats()
        assert (stats.batch_size, stats.queue_depth, stats.batch_slots) == (1, 1, 1)
        await asyncio.sleep(0)
        engine.cancel(first)
        engine.cancel(first)  # idempotent
        cancelled = await events(engine, first)
        engine._llm.gate.set()
        return cancelled, await events(engine, second)

    cancelled, finished = asyncio.run(run())
    assert cancelled == [FinishEvent("cancelled", 1, 0)]
    assert finished[-1] == FinishEvent("length", 1, 2, budget_cut=True)
    assert engine.stats().batch_size == 0


@pytest.mark.vllm
def test_penalties_bias_logprobs_and_the_policy_pass_through(engine) -> None:
    params = SimpleNamespace(
        max_tokens=4,
        temperature=0.5,
        top_p=0.9,
        seed=3,
        stop=("x",),
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.1,
        logit_bias=((7, 2.0),),
        logprobs=None,
    )
    sent = engine._sampling_params(GenerationRequest([1], params))  # type: ignore[arg-type]
    assert (sent.presence_penalty, sent.frequency_penalty) == (0.5, 0.25)
    assert sent.repetition_penalty == 1.1 and sent.logit_bias == {7: 2.0}
    assert sent.stop == ["x"] and sent.seed == 3
    assert sent.logprobs is None and sent.extra_args is None
    params.logprobs = 2
    digits = Constraint.regex("[0-9]{2}")
    table = asyncio.run(engine.constraints.compile(digits))
    graceful = engine.constraints.budget_policy("graceful")
    assert graceful is not None and engine.constraints.budget_policy("none") is None
    for policy, name in ((graceful, "graceful"), (None, "none")):
        request = GenerationRequest(
            [1],
            params,  # type: ignore[arg-type]
            constraint=PreparedConstraint.of(table, policy=policy, compiled_from=digits),
        )
        sent = engine._sampling_params(request)
        assert sent.logprobs == 2 and sent.extra_args["gclm_budget_policy"] == name


@pytest.mark.vllm
def test_a_dead_engine_core_fails_health_submits_and_running_requests(engine) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDead

    class DyingLLM(ScriptedLLM):
        async def generate(self, prompt: dict, sampling: object, request_id: str):
            self.errored = True
            raise VllmEngineDead()
            yield  # an async generator, as AsyncLLM.generate is

    engine._llm = DyingLLM([])
    engine.check_health()  # alive until the core dies

    async def run() -> list:
        return await events(engine, engine.submit(GenerationRequest([1], SamplingParams(2))))

    got = asyncio.run(run())
    assert isinstance(got[-1], ErrorEvent) and isinstance(got[-1].error, EngineDeadError)
    assert got[-1].error.status_code == 503
    with pytest.raises(EngineDeadError, match="vLLM's engine core died"):
        engine.check_health()
    with pytest.raises(EngineDeadError):
        engine.submit(GenerationRequest([1], SamplingParams(2)))
    engine.shutdown()
    with pytest.raises(EngineDeadError, match="shut down"):
        engine.check_health()


@pytest.mark.vllm
def test_stats_read_the_table_cache_as_the_transformers_engine_does(engine) -> None:
    asyncio.run(engine.constraints.compile(Constraint.regex("[0-9]{2}")))
    asyncio.run(engine.constraints.compile(Constraint.regex("[0-9]{2}")))
    stats = engine.stats()
    assert (stats.cache_misses, stats.cache_hits) == (1, 1)
    assert stats.gauges["table_cache_entries"] == 1
    assert stats.gauges["table_cache_bytes"] > 0 and stats.gauges["table_disk_files"] == 1


@pytest.mark.vllm
def test_a_request_vllm_refuses_is_the_clients_error(engine) -> None:
    """vLLM's validation errors become a 400 (this raised TypeError before: the
    InvalidRequestError was built without its `param`)."""

    class Refusing(ScriptedLLM):
        async def generate(self, prompt: dict, sampling: object, request_id: str):
            raise ValueError("This model's maximum context length is 2048 tokens.")
            yield  # an async generator, as AsyncLLM.generate is

    engine._llm = Refusing([])

    async def run() -> list:
        return await events(engine, engine.submit(GenerationRequest([1], SamplingParams(2))))

    got = asyncio.run(run())
    assert isinstance(got[-1], ErrorEvent) and isinstance(got[-1].error, InvalidRequestError)
    assert "maximum context length" in got[-1].error.message


@pytest.mark.vllm
def test_control_token_text_in_a_message_is_plain_text(engine, embedded_tokenizer) -> None:
    im_end = embedded_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = engine.prompts.encode_chat([{"role": "user", "content": "a <|im_end|> b"}])
    assert ids.count(im_end) == 2  # the template's own: the system turn's and the user's


# --- a thinking request: the thinking and the answer apart, the end marker in neither ---


def thinking_request(engine, tokenizer, table, max_tokens: int, stop: tuple[str, ...] = ()):
    from gclm.masking.reasoning import ThinkingSpec

    marker = tuple(tokenizer.encode("</think>", add_special_tokens=False))
    params = SamplingParams(max_tokens=max_tokens, stop=stop)
    digits = Constraint.regex("[0-9]{2}") if table is not None else None  # what `table` is
    return GenerationRequest(
        [1, 2],
        params,
        constraint=None if table is None else PreparedConstraint.of(table, compiled_from=digits),
        thinking=ThinkingSpec(marker),
    )


def split(got: list) -> tuple[str, str, tuple[int, ...]]:
    """(thinking text, answer text, every token id sent), from the events."""
    tokens = [e for e in got if isinstance(e, TokenEvent)]
    thought = "".join(e.text for e in tokens if e.reasoning)
    answer = "".join(e.text for e in tokens if not e.reasoning)
    return thought, answer, tuple(t for e in tokens for t in e.token_ids)


@pytest.mark.vllm
def test_a_constrained_thinking_request_splits_its_text(engine, embedded_tokenizer) -> None:
    """vLLM's outputs cut through the marker and merge tokens of both parts; the events
    split them on the token ids: the thought (a broken `</` match included), then the
    digits; the marker's tokens are counted as thinking, its text sent nowhere."""
    enc = lambda s: embedded_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    eos = engine.vocab.eos_token_id
    thought, marker, digit = enc("hm </ ok"), enc("</think>"), enc("7")
    assert len(digit) == 1
    sampled = [*thought, *marker, *digit, *digit, eos]
    steps = [(sampled[:4], "vLLM's text", None), (sampled[4:-2], "x", None)]
    steps.append((sampled[-2:], "x", "stop"))
    engine._llm = ScriptedLLM(steps)

    async def run() -> list:
        table = await engine.constraints.compile(Constraint.regex("[0-9]{2}"))
        request = thinking_request(engine, embedded_tokenizer, table, 16)
        return await events(engine, engine.submit(request))

    got = asyncio.run(run())
    assert split(got) == ("hm </ ok", "77", tuple(sampled[:-1]))
    tokens = [e for e in got if isinstance(e, TokenEvent)]
    flags = [e.reasoning for e in tokens]
    assert flags == sorted(flags, reverse=True), "thinking events come before the answer's"
    assert [t for e in tokens if not e.reasoning for t in e.token_ids] == [*digit, *digit]
    think = len(thought) + len(marker)
    assert got[-1] == FinishEvent("stop", 2, len(sampled), reasoning_tokens=think)
    sent = engine._llm.params[0].extra_args
    assert json.loads(sent["gclm_thinking"]) == {"end_ids": marker, "cap": None}


@pytest.mark.vllm
def test_an_unconstrained_thinking_request_splits_its_text_too(engine, embedded_tokenizer) -> None:
    enc = lambda s: embedded_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    sampled = [*enc("why"), *enc("</think>"), *enc("Because. END here")]
    engine._llm = ScriptedLLM([(sampled, "x", "stop")])

    async def run() -> list:
        request = thinking_request(engine, embedded_tokenizer, None, 32, stop=("END",))
        return await events(engine, engine.submit(request))

    got = asyncio.run(run())
    assert split(got)[:2] == ("why", "Because. ")  # the stop string ends the answer
    assert got[-1].reasoning_tokens == len(enc("why")) + 3
    assert engine._llm.params[0].extra_args is None  # no constraint: no processor row


@pytest.mark.vllm
def test_a_thinking_request_cut_off_while_thinking_sends_its_held_text(
    engine, embedded_tokenizer
) -> None:
    """The output ends on `</` (maybe the marker's start, so held back): it is thinking."""
    enc = lambda s: embedded_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    sampled = enc("so </")
    engine._llm = ScriptedLLM([(sampled, "x", "length")])

    async def run() -> list:
        request = thinking_request(engine, embedded_tokenizer, None, len(sampled))
        return await events(engine, engine.submit(request))

    got = asyncio.run(run())
    assert split(got)[:2] == ("so </", "")
    assert got[-1] == FinishEvent(
        "length", 2, len(sampled), budget_cut=True, reasoning_tokens=len(sampled)
    )
