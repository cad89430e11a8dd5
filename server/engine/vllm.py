"""The Engine protocol on vLLM: `gclm serve --engine vllm`.

vLLM's in-process `AsyncLLM` does the scheduling, paged KV cache, CUDA graphs and
tensor/pipeline parallelism; gclm's logits processor (`vllm_processor.py`) masks every
constrained row in vLLM's sampler, and gclm's HTTP layer stays in front, unchanged. One
request flows: `compile` (gclm's table cache, in a worker process) -> the app's budget check
-> `submit` (a task that runs `AsyncLLM.generate` with the constraint in `extra_args`) ->
each output's tokens to the request's `OutputTracker` (server/engine/output.py, as on the
transformers engine), with vLLM's detokenized text and the stop token vLLM named -> a
FinishEvent by the tracker's rule from vLLM's reason: a constrained output that vLLM cut at
`max_tokens` ("length") is complete by construction, so it finishes "stop".

A thinking request (a reasoning model's, `--reasoning-parser`) carries its ThinkingSpec to
the processor (`extra_args["gclm_thinking"]`), which masks its thinking and answer as a
ReasoningState; the tracker follows the same state (or a ThinkingWatch, without a
constraint) on the token ids and decodes the text itself, to send the thinking and the
answer as separate events, the end marker's text in neither, and to count reasoning_tokens.

The table reaches vLLM's engine-core processes through the on-disk cache (they inherit
GCLM_CACHE_DIR); they compile it themselves on a miss.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gclm.compiler import CompilerPool, TableCache, TokenVocabulary
from gclm.errors import (
    EngineDeadError,
    GclmError,
    InternalError,
    InvalidRequestError,
    QueueFullError,
    cut,
)
from gclm.server.engine.constraints import Constraints
from gclm.server.engine.logprobs import from_vllm
from gclm.server.engine.output import OutputTracker
from gclm.server.engine.protocol import (
    EngineStats,
    GenerationRequest,
    StreamEvent,
    TokenLogprob,
)
from gclm.server.engine.shared import TokenizerEngine, TokenizerPrompts
from gclm.server.settings import check_vllm_options

log = logging.getLogger("gclm.vllm")


@dataclass(frozen=True)
class VllmOptions:
    """vLLM's own engine options that `gclm serve --engine vllm` passes through.

    Raises ValueError (from the constructor) naming the bad option.
    """

    model: str  # a local directory or hub id
    served_name: str
    dtype: str = "auto"
    max_num_seqs: int = 8
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # mp | ray | uni | external_launcher
    gpu_memory_utilization: float = 0.9
    prefix_caching: bool | None = None  # None: vLLM's default
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1, got {self.max_num_seqs}.")
        check_vllm_options(self)

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        from gclm.server.engine.vllm_processor import GclmLogitsProcessor

        return AsyncEngineArgs(
            model=self.model,
            served_model_name=[self.served_name],
            dtype=self.dtype,
            max_num_seqs=self.max_num_seqs,
            max_model_len=self.max_model_len,
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            distributed_executor_backend=self.distributed_executor_backend,
            gpu_memory_utilization=self.gpu_memory_utilization,
            enable_prefix_caching=self.prefix_caching,
            enforce_eager=self.enforce_eager,
            logits_processors=[GclmLogitsProcessor],
            # Logprobs after gclm's mask, as on the transformers engine (a forbidden token
            # never shows). The cost: on CUDA vLLM's FlashInfer top-k/top-p kernel is off.
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
        )


def tracker_reason(reason: str | None) -> str:
    """vLLM's finish reason as `OutputTracker.finish` takes it: "abort" is "cancelled", no
    reason "stop"; "length" (vLLM's max_tokens, EOS counted) is the budget running out."""
    return "cancelled" if reason == "abort" else reason or "stop"


@dataclass(eq=False)
class VllmRequest:
    """One submitted request: its output, its events, and the task that drives it through
    vLLM."""

    request: GenerationRequest
    request_id: str
    token_bytes: Sequence[bytes | None]
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    output: OutputTracker = field(init=False)

    def __post_init__(self) -> None:
        self.output = OutputTracker(self.request, self.token_bytes, self.events.put_nowait)


class VllmEngine(TokenizerEngine):
    """Implements gclm.server.engine.protocol.Engine on vLLM's AsyncLLM. Call `await start()` on the
    serving event loop before the first request."""

    def __init__(
        self,
        options: VllmOptions,
        tokenizer: Any,
        *,
        model_id: str,
        vocab: TokenVocabulary,
        cache: TableCache,
        compiler: CompilerPool | None = None,
        queue_size: int = 64,
        compile_threads: int = 4,
    ):
        from gclm.server.engine.vllm_processor import GclmLogitsProcessor, TableSource

        self.options = options
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.vocab = vocab
        # Whole tables only: vLLM's processes mask with tables of their own.
        self.constraints = Constraints(
            vocab, cache, compiler, threads=compile_threads, first_masks=False
        )
        self.queue_size = queue_size
        self.context_length = 0  # vLLM's max_model_len, known once started
        self.prompts = TokenizerPrompts(tokenizer, vocab, lambda: self.context_length)
        self._active: set[VllmRequest] = set()
        self._llm: Any = None
        self._shut = False
        # validate_params in this process reads the tables this engine compiles.
        GclmLogitsProcessor.serve_frontend(TableSource(vocab, cache))

    async def start(self) -> None:
        """Start vLLM (its engine-core processes load the model)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        self._llm = AsyncLLM.from_engine_args(self.options.engine_args())
        self.context_length = int(self._llm.model_config.max_model_len)

    def check_health(self) -> None:
        """Dead once vLLM's engine core has died (its `errored`: the core process gone or
        its output loop ended), or once shut down; vLLM itself never recovers from either."""
        if self._shut:
            raise EngineDeadError("the engine was shut down")
        if self._llm is None:
            raise EngineDeadError("vLLM was never started: await engine.start() first")
        if self._llm.errored:
            raise EngineDeadError(f"vLLM's engine core died: {self._llm.dead_error!r}")

    # --- the Engine interface ---

    def submit(self, request: GenerationRequest) -> VllmRequest:
        self.check_health()
        self.check_admissible(request)
        if request.constraint is not None and request.constraint.table is None:
            # prepare() never answers first masks here (Constraints(first_masks=False)).
            raise InternalError("vLLM's processes mask with whole tables, not first masks.")
        if len(self._active) >= self.options.max_num_seqs + self.queue_size:
            raise QueueFullError(self.queue_size, retry_after=1.0)
        handle = VllmRequest(
            request, request.request_id or uuid.uuid4().hex, self.vocab.token_bytes
        )
        sampling = self._sampling_params(request)
        self._active.add(handle)
        handle.task = asyncio.get_running_loop().create_task(self._run(handle, sampling))
        return handle

    def cancel(self, handle: VllmRequest) -> None:
        if handle.task is not None and not handle.task.done():
            handle.task.cancel()  # AsyncLLM.generate aborts the request in vLLM

    def stats(self) -> EngineStats:
        active, slots = len(self._active), self.options.max_num_seqs
        return self.engine_stats(
            queue_depth=max(0, active - slots), batch_size=min(active, slots), batch_slots=slots
        )

    def shutdown(self) -> None:
        from gclm.server.engine.vllm_processor import GclmLogitsProcessor

        GclmLogitsProcessor.serve_frontend(None)
        self._shut = True
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        self.constraints.close()

    # --- one request ---

    def _sampling_params(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from gclm.masking.vllm import BUDGET_AWARE_KEY, POLICY_KEY, sampling_extra_args

        p = request.params
        extra: dict[str, Any] | None = None
        constraint = request.constraint
        if constraint is not None:  # a whole table: submit refuses first masks
            if constraint.compiled_from is None:
                raise InternalError("A constrained request reached vLLM without its constraint.")
            extra = {
                **sampling_extra_args(constraint.compiled_from, request.thinking),
                BUDGET_AWARE_KEY: int(constraint.budget_aware),
                # The app asks for the policy by name; the processor has its own copy.
                POLICY_KEY: "graceful" if constraint.policy is not None else "none",
            }
        # Penalties and bias change finite logits only: a token the mask sets to -inf stays
        # there, so vLLM's own implementations keep the guarantee.
        return SamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            presence_penalty=getattr(p, "presence_penalty", 0.0),
            frequency_penalty=getattr(p, "frequency_penalty", 0.0),
            repetition_penalty=getattr(p, "repetition_penalty", 1.0),
            logit_bias=dict(getattr(p, "logit_bias", ())) or None,
            logprobs=p.logprobs,
            # A constrained output ends where its constraint does; stop strings would cut it.
            stop=list(p.stop) if constraint is None else None,
            extra_args=extra,
            output_kind=RequestOutputKind.DELTA,
        )

    async def _run(self, handle: VllmRequest, sampling: Any) -> None:
        request, output = handle.request, handle.output
        reason: str | None = None
        k = request.params.logprobs
        try:
            prompt = {"prompt_token_ids": request.prompt_ids}
            async for step in self._llm.generate(prompt, sampling, handle.request_id):
                out = step.outputs[0]
                output.cached_tokens = step.num_cached_tokens or output.cached_tokens
                ends = self._stop_ids(out) if out.finish_reason == "stop" else ()
                ids = list(out.token_ids)
                if ids and ids[-1] in ends:
                    ids.pop()  # EOS ends the output; it is not part of it (as on our engine)
                logprobs: tuple[TokenLogprob, ...] = ()
                if k is not None and out.logprobs:
                    logprobs = from_vllm(ids, out.logprobs[: len(ids)], self.token_names, k)
                output.take(out.token_ids, logprobs, eos_ids=ends, text=out.text)
                reason = out.finish_reason or reason
        except asyncio.CancelledError:
            output.finish("cancelled")
            raise
        except Exception as e:  # vLLM refused or failed the request: fail it alone
            if not isinstance(e, GclmError):
                log.exception("vLLM request %s failed", handle.request_id)
                e = _as_gclm_error(e)
            output.fail(e)
            return
        finally:
            self._active.discard(handle)
        output.finish(tracker_reason(reason))

    def _stop_ids(self, out: Any) -> tuple[int, ...]:
        """The token ids that ended `out` without being part of it: EOS, or the stop token
        id vLLM names (`stop_reason`; a stop string's is text and stays)."""
        reason = getattr(out, "stop_reason", None)
        eos = self.vocab.eos_token_id
        return (eos, reason) if isinstance(reason, int) else (eos,)


def _as_gclm_error(e: Exception) -> GclmError:
    """vLLM's request validation errors are the client's; a dead engine core is a 503 (the
    server must be restarted); anything else is ours."""
    try:
        from vllm.exceptions import VLLMValidationError
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDead
    except ImportError:  # pragma: no cover - vLLM always has them where this engine runs
        VLLMValidationError = ValueError  # noqa: N806
        VllmEngineDead = RuntimeError  # noqa: N806
    if isinstance(e, VllmEngineDead):
        return EngineDeadError(f"vLLM's engine core died: {e!r}")
    if isinstance(e, VLLMValidationError | ValueError):
        return InvalidRequestError(cut(str(e), 400), param=None)
    log.error("vLLM failed a request", exc_info=e)
    return InternalError("Generation failed in vLLM; the server's log has the details.")


def configure_cpu_defaults(cache_dir: os.PathLike[str] | str) -> None:
    """Environment for vLLM's processes, before they start: gclm's table cache (so engine
    cores find the tables), the V1 model runner (GclmLogitsProcessor implements the V1
    logits-processor interface), and a KV cache of 1 GiB on CPU unless set."""
    os.environ["GCLM_CACHE_DIR"] = str(cache_dir)
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
