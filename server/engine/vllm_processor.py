"""gclm's logits processor for vLLM: where its tables come from, and the class vLLM loads.

    GCLM_VLLM_TOKENIZER=MODEL python -m vllm.entrypoints.openai.api_server --model MODEL \\
        --logits-processors gclm.server.engine.vllm_processor:GclmLogitsProcessor

    client.chat.completions.create(model=MODEL, messages=..., max_tokens=40,
        extra_body={"vllm_xargs": {"gclm": json.dumps({"json": schema})}})

What a request may ask and what it is guaranteed is masking/vllm.py's; this module finds the
tables: the served tokenizer's vocabulary, gclm's table cache (memory, then the disk cache
at `$GCLM_CACHE_DIR/tables`), and a compiler. Nothing is found by looking around: each
process is told.

- frontend (the API server's process): vLLM calls `validate_params` with the request's
  SamplingParams and nothing else, so the tokenizer is given to the class. `gclm serve
  --engine vllm` hands it its engine's own tables (`serve_frontend`); a plain vLLM server
  names the tokenizer in `GCLM_VLLM_TOKENIZER` (and `GCLM_VLLM_TOKENIZER_REVISION`), read
  on the first constrained request, which loads it and starts the compile workers (a
  compile is not charged for their start: compiler/service/pool.py). A constrained request that
  finds neither is refused (400) with that fix; it is never let through unchecked.
- engine core / workers: vLLM builds the processor with its VllmConfig, whose model config
  names the tokenizer; tables are read from the same disk cache, and compiled in process on
  a miss (vLLM's workers are daemons and cannot start processes; they compile only what the
  frontend already did, or on a node without the shared cache).

Speculative decoding is refused by vLLM itself for custom logits processors, and the V2
model runner (`VLLM_USE_V2_MODEL_RUNNER=1`, the default on GPUs with Triton) loads only
V2-interface processors: run with `VLLM_USE_V2_MODEL_RUNNER=0`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from gclm.compiler import CompiledTable, Constraint, TableCache, TokenVocabulary
from gclm.masking.masks import mask_table
from gclm.masking.vllm import EXTRA_ARGS_KEY, ConstraintBatch, check_request

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig

    from gclm.compiler import CompilerPool

# The frontend's tokenizer for a plain vLLM server (a path or hub id), and its revision.
TOKENIZER_ENV = "GCLM_VLLM_TOKENIZER"
REVISION_ENV = "GCLM_VLLM_TOKENIZER_REVISION"


@dataclass
class TableSource:
    """A tokenizer's vocabulary and the table cache that serves its constraints
    (masking/vllm.py's Tables)."""

    vocab: TokenVocabulary
    cache: TableCache
    pool: CompilerPool | None = None  # the compile workers `load` started, if any

    def table(self, constraint: Constraint) -> CompiledTable:
        table = self.cache.get(constraint)
        mask_table(table)  # build the mask rows now, not while masking a step
        return table

    @classmethod
    def load(cls, tokenizer: str, *, revision: str | None = None, isolated: bool) -> TableSource:
        """Load `tokenizer` (a path or hub id) and make its table cache over gclm's disk
        cache. `isolated` compiles in worker processes with gclm's time limit (the frontend,
        which must not hang on a pathological schema); otherwise in this process."""
        from transformers import AutoTokenizer

        vocab = TokenVocabulary.from_tokenizer(
            AutoTokenizer.from_pretrained(tokenizer, revision=revision)
        )
        compile_fn: Callable[[Constraint], CompiledTable]
        pool = None
        if isolated:
            from gclm.compiler import CompilerPool

            pool = CompilerPool(vocab)
            compile_fn = pool.compile
        else:
            from gclm.compiler import compile_constraint

            def compile_fn(c: Constraint) -> CompiledTable:
                return compile_constraint(c, vocab)

        cache = TableCache(compile_fn, vocab.fingerprint, disk_dir=tables_dir())
        return cls(vocab, cache, pool)

    def close(self) -> None:
        """Stop the cache's threads and the compile workers `load` started."""
        self.cache.close()
        if self.pool is not None:
            self.pool.close()


def tables_dir() -> Path:
    """gclm's on-disk table cache, shared with `gclm serve`."""
    from gclm.paths import default_cache_dir

    return default_cache_dir() / "tables"


class GclmLogitsProcessor(LogitsProcessor):
    """Masks every constrained row to the tokens its constraint and remaining budget allow
    (masking/vllm.py's ConstraintBatch); rows without `extra_args["gclm"]` are untouched."""

    # The frontend's tables: given by `serve_frontend`, or loaded from GCLM_VLLM_TOKENIZER.
    _frontend: ClassVar[TableSource | None] = None
    _frontend_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def serve_frontend(cls, source: TableSource | None) -> None:
        """Make `validate_params` in this process use `source` (`gclm serve --engine vllm`:
        its engine's vocabulary and table cache); None forgets it."""
        with cls._frontend_lock:
            cls._frontend = source

    @classmethod
    def frontend_tables(cls) -> TableSource:
        """The tables `validate_params` checks a request with.

        Raises:
            ValueError: none was given and GCLM_VLLM_TOKENIZER is not set (the fix).
        """
        with cls._frontend_lock:
            if cls._frontend is None:
                tokenizer = os.environ.get(TOKENIZER_ENV)
                if not tokenizer:
                    raise ValueError(
                        f"gclm's logits processor does not know the served model's tokenizer, "
                        f"so it cannot check the constraint in extra_args[{EXTRA_ARGS_KEY!r}]. "
                        f"Start vLLM with {TOKENIZER_ENV} set to the model (or tokenizer) it "
                        f"serves, e.g. {TOKENIZER_ENV}=MODEL vllm serve MODEL --logits-processors "
                        "gclm.server.engine.vllm_processor:GclmLogitsProcessor; or serve with "
                        "`gclm serve --engine vllm`."
                    )
                revision = os.environ.get(REVISION_ENV) or None
                try:
                    source = TableSource.load(tokenizer, revision=revision, isolated=True)
                except Exception as e:  # vLLM answers a ValueError with a 400, others 500
                    raise ValueError(
                        f"gclm could not load the tokenizer {TOKENIZER_ENV}={tokenizer!r}: "
                        f"{e}. Set it to the model (or tokenizer) vLLM serves."
                    ) from e
                cls._frontend = source
            return cls._frontend

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Parse and compile the request's constraint and check its budget (frontend).

        Raises:
            ValueError: gclm's message (vLLM answers 400): masking/vllm.py's check_request,
                or the tokenizer is unknown (frontend_tables).
        """
        check_request(sampling_params, cls.frontend_tables)

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        model = vllm_config.model_config
        self.source = TableSource.load(
            str(model.tokenizer), revision=model.tokenizer_revision, isolated=False
        )
        self.batch = ConstraintBatch(
            self.source, int(model.max_model_len), vllm_config.scheduler_config.max_num_seqs
        )

    def is_argmax_invariant(self) -> bool:
        """The mask changes which token is most likely."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        self.batch.update_state(batch_update)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the constrained rows of `logits` [B, V_logits] in place."""
        return self.batch.apply(logits)
