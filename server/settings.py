"""Server configuration: one frozen dataclass, validated once, settable from GCLM_* variables.

Every field can be set by an environment variable named `GCLM_` + the field name in upper
case (`GCLM_PORT=9000`, `GCLM_API_KEY=...`). The CLI builds its settings with
`ServerSettings.from_env(**cli_overrides)`: explicit overrides win over the environment,
which wins over the defaults below.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gclm.paths import default_cache_dir

ENV_PREFIX = "GCLM_"

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DTYPES = ("auto", "float32", "float16", "bfloat16")
ENGINES = ("transformers", "vllm")
SWITCHES = ("auto", "on", "off")
EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")
REASONING_PARSERS = ("deepseek_r1", "qwen3")  # server/openai/reasoning.py PARSERS' names


def check_vllm_options(options: Any) -> None:
    """Check vLLM's own options, read from `options` by name: the one check for both
    ServerSettings and the vLLM engine's VllmOptions, whose fields share these names.

    Raises ValueError naming the bad option.
    """
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(options, name) < 1:
            raise ValueError(f"{name} must be at least 1, got {getattr(options, name)}.")
    if options.max_model_len is not None and options.max_model_len < 1:
        raise ValueError(f"max_model_len must be at least 1, got {options.max_model_len}.")
    if not 0 < options.gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization must be in (0, 1], got {options.gpu_memory_utilization}."
        )
    backend = options.distributed_executor_backend
    if backend not in (None, *EXECUTOR_BACKENDS):
        raise ValueError(
            f"distributed_executor_backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
            f"got {backend!r}."
        )


@dataclass(frozen=True)
class ServerSettings:
    """How the server listens, which model it serves, and its per-request defaults.

    Budget defaults (the `max_tokens` used when a request sets neither `max_tokens` nor
    `max_completion_tokens`):
      - unconstrained requests get `default_max_tokens`;
      - constrained requests get `max(constrained_max_tokens_floor,
        constrained_max_tokens_factor * table.min_tokens)`, so a default budget always
        leaves room to finish the constraint.

    Raises ValueError (from the constructor) naming the bad field and the accepted values.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    model: str | None = None  # a Hugging Face id or local path; None: the embedded default
    device: str = "auto"  # auto | cpu | mps | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    max_batch: int = 0  # sequences decoded together; 0: as many as kv_memory holds
    kv_memory: int = 0  # MiB for the KV cache; 0: a share of the free memory
    fast_forward: str = "on"  # on | off: feed drafts of forced text (masking/drafts.py)
    queue_size: int = 64  # sequences waiting beyond the free KV slots before submit answers 429
    # Positions one engine step computes, running rows and prompt chunks together (a longer
    # prompt is prefilled over several steps); 0: 512 on the CPU, 2048 on a GPU.
    max_num_batched_tokens: int = 0
    # While streams decode, prompt chunks small enough that a step takes about this many
    # seconds (the engine times its steps; server/engine/transformers/pace.py); 0: off.
    max_step_seconds: float = 1.0
    # Long prompts prefilled on a thread of their own beside the steps (auto: on a CPU with a
    # core to spare for it; server/engine/transformers/side_prefill.py): on | off | auto.
    prefill_thread: str = "auto"
    cache_dir: Path = field(default_factory=default_cache_dir)  # compiled-table disk cache
    compile_timeout: float = 10.0  # seconds a request may wait for its compile, queue included
    compile_workers: int = 0  # compile processes at normal priority; 0: one per CPU core, 2-8
    compile_queue: int = 64  # compiles waiting for a worker before a 429
    compile_memory: int = 4096  # MiB of address space per compile process
    # CPU seconds one compile may use, in the background past its request's timeout too;
    # past it the constraint is refused (400 compile_limit) at once from then on
    compile_cpu_limit: float = 60.0
    cache_memory: int = 512  # MiB for compiled tables + their mask rows + failures, in memory
    cache_disk: int = 2048  # MiB of compiled tables on disk (under cache_dir/tables); 0: none
    max_body_size: int = 16  # MiB; larger request bodies get 413
    # Connections (server/http/connections.py): a request's headers and its body must each
    # arrive within their timeout, an idle kept-alive connection is closed, and past
    # max_connections open connections a request gets 503.
    header_timeout: float = 10.0  # seconds
    body_timeout: float = 60.0  # seconds
    keep_alive_timeout: float = 5.0  # seconds
    max_connections: int = 1024
    # Browsers (server/http/browsers.py): origins allowed by CORS, comma-separated ("*": any;
    # None: CORS off), and the Host names the server answers to (None: any).
    cors_origins: str | None = None
    allowed_hosts: str | None = None
    # With a key (server/http/keys.py) every route but /health needs "Authorization: Bearer
    # <key>"; a keys file holds several, each with optional limits; public_metrics "on"
    # leaves /metrics open to a scraper.
    api_key: str | None = None
    api_keys_file: Path | None = None
    public_metrics: str = "off"  # on | off
    default_max_tokens: int = 256
    constrained_max_tokens_floor: int = 512
    constrained_max_tokens_factor: int = 2
    # A reasoning model's thinking markers (server/openai/reasoning.py PARSERS); None: off.
    reasoning_parser: str | None = None
    chat_template: Path | None = None  # a Jinja file replacing the model's chat template
    # The engine behind the API: gclm's own on transformers, or vLLM (`--engine vllm`,
    # needs vLLM's environment). The options below are vLLM's own and apply only to it.
    engine: str = "transformers"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # mp | ray | uni | external_launcher
    max_model_len: int | None = None  # None: the model's
    gpu_memory_utilization: float = 0.9
    prefix_caching: str = "auto"  # auto (vLLM's default) | on | off
    enforce_eager: str = "off"  # on: no torch.compile / CUDA graphs (starts faster)

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host must be a non-empty hostname or IP address, e.g. 127.0.0.1.")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}.")
        if self.model is not None and not self.model.strip():
            raise ValueError("model must be a model id or path; leave it unset for the default.")
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}.")
        for name in ("max_batch", "kv_memory"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{name} must be 0 (from the free memory) or more, got {getattr(self, name)}."
                )
        if self.public_metrics not in ("on", "off"):
            raise ValueError(f"public_metrics must be on or off, got {self.public_metrics!r}.")
        if self.max_num_batched_tokens < 0:
            raise ValueError(
                "max_num_batched_tokens must be 0 (the device's default) or more, got "
                f"{self.max_num_batched_tokens}."
            )
        if not self.max_step_seconds >= 0:  # NaN too
            raise ValueError(
                f"max_step_seconds must be 0 (off) or more, got {self.max_step_seconds}."
            )
        if self.prefill_thread not in ("auto", "on", "off"):
            raise ValueError(
                f"prefill_thread must be auto, on or off, got {self.prefill_thread!r}."
            )
        if self.fast_forward not in ("on", "off"):
            raise ValueError(f"fast_forward must be on or off, got {self.fast_forward!r}.")
        for name in (
            "queue_size",
            "compile_queue",
            "cache_memory",
            "max_body_size",
            "max_connections",
            "default_max_tokens",
            "constrained_max_tokens_floor",
            "constrained_max_tokens_factor",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}.")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{name} must be a positive number of seconds, got {getattr(self, name)}."
                )
        if not self.compile_timeout > 0:
            raise ValueError(
                f"compile_timeout must be a positive number of seconds, got {self.compile_timeout}."
            )
        if self.compile_workers < 0:
            raise ValueError(
                f"compile_workers must be 0 (one per core) or more, got {self.compile_workers}."
            )
        if not self.compile_cpu_limit > 0:
            raise ValueError(
                "compile_cpu_limit must be a positive number of seconds, "
                f"got {self.compile_cpu_limit}."
            )
        if self.compile_memory < 256:
            raise ValueError(f"compile_memory must be at least 256 MiB, got {self.compile_memory}.")
        if self.cache_disk < 0:
            raise ValueError(
                f"cache_disk must be 0 (no disk cache) or more MiB, got {self.cache_disk}."
            )
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}.")
        for name in ("prefix_caching", "enforce_eager"):
            if getattr(self, name) not in SWITCHES:
                raise ValueError(f"{name} must be auto, on or off, got {getattr(self, name)!r}.")
        check_vllm_options(self)
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank; leave it unset to disable authentication.")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                f"got {self.reasoning_parser!r}."
            )
        if self.chat_template is not None:
            object.__setattr__(self, "chat_template", Path(self.chat_template).expanduser())
        # A str path from the environment or the CLI is normalised here so callers get a Path.
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())

    @property
    def cors_origin_list(self) -> tuple[str, ...]:
        """The origins CORS allows (empty: CORS is off)."""
        return _items(self.cors_origins)

    @property
    def allowed_host_list(self) -> tuple[str, ...]:
        """The Host names accepted (empty: any)."""
        return _items(self.allowed_hosts)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ServerSettings:
        """Settings from GCLM_* variables, then `overrides` on top.

        Overrides whose value is None are ignored, so an argparse namespace with None
        defaults can be passed as `**vars(args)` (minus any non-setting keys) and unset
        options fall through to the environment and then to the defaults. Empty
        environment variables count as unset.

        Raises ValueError for an unknown override, an unparsable variable, or an invalid
        value.
        """
        environ = os.environ if environ is None else environ
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ValueError(f"Unknown setting(s): {', '.join(unknown)}.")
        values: dict[str, Any] = {}
        for name in known:
            raw = environ.get(ENV_PREFIX + name.upper(), "")
            if raw.strip():
                values[name] = _parse(name, raw.strip(), _field_type(cls, name))
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _items(listed: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (listed or "").split(",") if item.strip())


def _field_type(cls: type, name: str) -> str:
    # With `from __future__ import annotations` the annotations are strings; the scalar
    # type is the first name in them ("int", "str | None", "Path").
    return str(cls.__annotations__[name]).split("|")[0].strip()


def _parse(name: str, raw: str, kind: str) -> Any:
    var = ENV_PREFIX + name.upper()
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ValueError(
            f"{var} must be a{'n integer' if kind == 'int' else ' number'}, got {raw!r}."
        ) from None
    if kind == "Path":
        return Path(raw)
    return raw
