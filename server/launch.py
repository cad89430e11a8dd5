"""Wire settings into a running server: model, compiler pool, table cache, engine, app."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

from gclm.compiler.cache import TableCache
from gclm.compiler.pool import START_TIMEOUT_S, CompilerPool
from gclm.compiler.vocabulary import TokenVocabulary
from gclm.compiler.worker import CompileLimits
from gclm.masking.masks import table_memory
from gclm.server.engine import BatchEngine
from gclm.server.settings import ServerSettings

log = logging.getLogger("gclm.server")


def build_engine(settings: ServerSettings) -> tuple[BatchEngine, CompilerPool]:
    """Load the model and start the compile workers and the engine thread."""
    from gclm.server.model import load_model

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
    vocab = TokenVocabulary.from_tokenizer(loaded.tokenizer)
    limits = CompileLimits(
        timeout_s=settings.compile_timeout, memory_bytes=settings.compile_memory << 20
    )
    pool = CompilerPool(
        vocab,
        limits,
        workers=settings.compile_workers or None,
        queue_size=settings.compile_queue,
    )
    if not pool.wait_ready(START_TIMEOUT_S):
        log.warning(
            "the compile workers are not ready after %.0f s; serving anyway", START_TIMEOUT_S
        )
    cache = TableCache(
        pool.submit,
        vocab.fingerprint,
        max_bytes=settings.cache_memory << 20,
        disk_dir=settings.cache_dir / "tables" if settings.cache_disk else None,
        disk_max_bytes=max(1, settings.cache_disk) << 20,
        measure=table_memory,
    )
    engine = BatchEngine(
        loaded.model,
        loaded.tokenizer,
        model_id=loaded.model_id,
        vocab=vocab,
        cache=cache,
        compiler=pool,
        max_batch=settings.max_batch,
        queue_size=settings.queue_size,
    )
    return engine, pool


def serve(settings: ServerSettings) -> None:
    """Run until interrupted."""
    import uvicorn

    from gclm.server.app import create_app

    engine, pool = build_engine(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: object) -> AsyncIterator[None]:
        # uvicorn re-raises SIGTERM after its own shutdown, so a `finally` around run()
        # never runs then; the lifespan's exit does.
        try:
            yield
        finally:
            engine.shutdown()
            pool.close()

    try:
        app = create_app(engine, settings)
        app.router.lifespan_context = lifespan
        log.info("serving %s on http://%s:%d/v1", engine.model_id, settings.host, settings.port)
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
    finally:
        engine.shutdown()
        pool.close()
