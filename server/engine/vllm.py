"""The Engine protocol on vLLM: `gclm serve --engine vllm`.

vLLM's in-process `AsyncLLM` does the scheduling, paged KV cache, CUDA graphs and
tensor/pipeline parallelism; gclm's logits processor (`gclm.masking.vllm`) masks every
constrained row in vLLM's sampler, and gclm's HTTP layer stays in front, unchanged. One
request flows: `compile` (gclm's table cache, in a worker process) -> the app's budget check
-> `submit` (a task that runs `AsyncLLM.generate` with the constraint in `extra_args`) ->
per-token events with vLLM's detokenized text -> a FinishEvent whose reason is gclm's: a
constrained output that vLLM cut at `max_tokens` ("length") is complete by construction,
so it finishes "stop" when its DFA accepts it.

The table reaches vLLM's engine-core processes through the on-disk cache (they inherit
GCLM_CACHE_DIR); they compile it themselves on a miss.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gclm.compiler.cache import TableCache
from gclm.compiler.constraint import Constraint
from gclm.compiler.tables import CompiledTable
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.errors import GclmError, InternalError, InvalidRequestError, QueueFullError
from gclm.masking import ConstraintState, check_budget, mask_table
from gclm.server.engine.protocol import (
    ErrorEvent,
    FinishEvent,
    GenerationRequest,
    StreamEvent,
    TokenEvent,
    until_done,
)

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
        for name in ("max_num_seqs", "tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be at least 1, got {self.max_model_len}.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}."
            )
        backends = ("mp", "ray", "uni", "external_launcher")
        if self.distributed_executor_backend not in (None, *backends):
            raise ValueError(
                f"distributed_executor_backend must be one of {', '.join(backends)}, got "
                f"{self.distributed_executor_backend!r}."
            )

    def engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        from gclm.masking.vllm import GclmLogitsProcessor

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
            disable_log_stats=True,
        )


@dataclass(eq=False)
class VllmRequest:
    """One submitted request: its events, and the task that drives it through vLLM."""

    request: GenerationRequest
    request_id: str
    events: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    state: ConstraintState | None = None
    finished: bool = False

    def send(self, event: StreamEvent) -> None:
        if not self.finished:
            self.finished = isinstance(event, FinishEvent | ErrorEvent)
            self.events.put_nowait(event)


class VllmEngine:
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
        queue_size: int = 64,
        compile_threads: int = 4,
    ):
        from gclm.masking.vllm import TableSource, register_frontend

        self.options = options
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.vocab = vocab
        self.cache = cache
        self.queue_size = queue_size
        self.context_length = 0  # vLLM's max_model_len, known once started
        self._compile_pool = ThreadPoolExecutor(compile_threads, thread_name_prefix="gclm-compile")
        self._constraints: weakref.WeakKeyDictionary[CompiledTable, Constraint] = (
            weakref.WeakKeyDictionary()
        )
        self._active: set[VllmRequest] = set()
        self._llm: Any = None
        # validate_params in this process reads the tables this engine compiles.
        register_frontend(TableSource(vocab, cache))

    async def start(self) -> None:
        """Start vLLM (its engine-core processes load the model)."""
        from vllm.v1.engine.async_llm import AsyncLLM

        self._llm = AsyncLLM.from_engine_args(self.options.engine_args())
        self.context_length = int(self._llm.model_config.max_model_len)

    # --- the Engine interface ---

    async def compile(self, constraint: Constraint) -> CompiledTable:
        loop = asyncio.get_running_loop()
        table = await loop.run_in_executor(self._compile_pool, self._prepare, constraint)
        self._constraints[table] = constraint
        return table

    def _prepare(self, constraint: Constraint) -> CompiledTable:
        table = self.cache.get(constraint)
        mask_table(table)
        return table

    def encode_prompt(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt, add_special_tokens=True))

    def render_chat(self, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **template_kwargs
            )
        except Exception as e:  # the template's own checks (roles, order)
            raise InvalidRequestError(
                f"The model's chat template rejected the messages: {e}", param="messages"
            ) from e

    def budget_policy(self, name: str) -> None:
        """No BudgetPolicy runs inside vLLM yet: every budget-aware row gets the plain
        budget-aware mask (valid and within budget; spare tokens are not paced)."""
        return None

    def submit(self, request: GenerationRequest) -> VllmRequest:
        if self._llm is None:
            raise InternalError("The vLLM engine is not started yet.")
        if not request.prompt_ids:
            raise InvalidRequestError("The prompt is empty.", param="prompt")
        if len(request.prompt_ids) + request.params.max_tokens > self.context_length:
            raise InvalidRequestError(
                f"The prompt ({len(request.prompt_ids)} tokens) plus max_tokens "
                f"({request.params.max_tokens}) exceeds the model's context of "
                f"{self.context_length} tokens. Shorten the prompt or lower max_tokens.",
                param="max_tokens",
            )
        if max(request.prompt_ids) >= self.vocab.size or min(request.prompt_ids) < 0:
            raise InvalidRequestError(
                f"Prompt token ids must be in [0, {self.vocab.size}).", param="prompt"
            )
        table = request.table
        if table is not None and request.budget_aware:
            check_budget(table, request.params.max_tokens)
        if len(self._active) >= self.options.max_num_seqs + self.queue_size:
            raise QueueFullError(self.queue_size, retry_after=1.0)
        handle = VllmRequest(request, request.request_id or uuid.uuid4().hex)
        if table is not None:
            handle.state = ConstraintState(table, budget_aware=request.budget_aware)
        sampling = self._sampling_params(request)
        self._active.add(handle)
        handle.task = asyncio.get_running_loop().create_task(self._run(handle, sampling))
        return handle

    def stream(self, handle: VllmRequest) -> AsyncIterator[StreamEvent]:  # type: ignore[override]
        return until_done(handle.events)

    def cancel(self, handle: VllmRequest) -> None:
        if handle.task is not None and not handle.task.done():
            handle.task.cancel()  # AsyncLLM.generate aborts the request in vLLM

    def stats(self) -> dict[str, float]:
        s = self.cache.stats
        active = len(self._active)
        return {
            "queue_depth": max(0, active - self.options.max_num_seqs),
            "batch_size": min(active, self.options.max_num_seqs),
            "cache_hits": s.hits + s.negative_hits,
            "cache_misses": s.misses,
        }

    def shutdown(self) -> None:
        from gclm.masking.vllm import register_frontend

        register_frontend(None)
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None
        self._compile_pool.shutdown(wait=False, cancel_futures=True)

    # --- one request ---

    def _sampling_params(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from gclm.masking.vllm import BUDGET_AWARE_KEY, sampling_extra_args

        p = request.params
        if getattr(p, "logprobs", None) is not None:
            raise InvalidRequestError(
                "logprobs are not supported with --engine vllm yet; leave them out or use "
                "the transformers engine.",
                param="logprobs",
            )
        extra: dict[str, Any] | None = None
        if request.table is not None:
            extra = sampling_extra_args(self._constraints[request.table])
            extra[BUDGET_AWARE_KEY] = int(request.budget_aware)
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
            # A constrained output ends where its constraint does; stop strings would cut it.
            stop=list(p.stop) if request.table is None else None,
            extra_args=extra,
            output_kind=RequestOutputKind.DELTA,
        )

    async def _run(self, handle: VllmRequest, sampling: Any) -> None:
        request = handle.request
        generated = 0
        reason: str | None = None
        try:
            prompt = {"prompt_token_ids": request.prompt_ids}
            async for output in self._llm.generate(prompt, sampling, handle.request_id):
                out = output.outputs[0]
                generated += len(out.token_ids)
                if handle.state is not None:
                    for token in out.token_ids:
                        handle.state.advance(token)
                if out.text:
                    handle.send(TokenEvent(out.text, tuple(out.token_ids)))
                reason = out.finish_reason or reason
        except asyncio.CancelledError:
            handle.send(FinishEvent("cancelled", len(request.prompt_ids), generated))
            raise
        except Exception as e:  # vLLM refused or failed the request: fail it alone
            if not isinstance(e, GclmError):
                log.exception("vLLM request %s failed", handle.request_id)
                e = _as_gclm_error(e)
            handle.send(ErrorEvent(e))
            return
        finally:
            self._active.discard(handle)
        handle.send(
            FinishEvent(self._finish_reason(handle, reason), len(request.prompt_ids), generated)
        )

    @staticmethod
    def _finish_reason(handle: VllmRequest, reason: str | None) -> str:
        state = handle.state
        if reason == "abort":
            return "cancelled"
        if state is not None and reason == "length" and state.is_accepting:
            return "stop"  # complete by construction: the budget ran out exactly at the end
        return reason or "stop"


def _as_gclm_error(e: Exception) -> GclmError:
    """vLLM's request validation errors are the client's; anything else is ours."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:  # pragma: no cover - vLLM always has it where this engine runs
        VLLMValidationError = ValueError  # noqa: N806
    if isinstance(e, VLLMValidationError | ValueError):
        return InvalidRequestError(str(e))
    return InternalError(f"Generation failed in vLLM: {e!r}")


def configure_cpu_defaults(cache_dir: os.PathLike[str] | str) -> None:
    """Environment for vLLM's processes, before they start: gclm's table cache (so engine
    cores find the tables), the V1 model runner (GclmLogitsProcessor implements the V1
    logits-processor interface), and a KV cache of 1 GiB on CPU unless set."""
    os.environ["GCLM_CACHE_DIR"] = str(cache_dir)
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
