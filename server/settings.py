"""Server configuration: one frozen dataclass, validated once, settable from GCLM_* variables.

Every field can be set by an environment variable named `GCLM_` + the field name in upper
case (`GCLM_PORT=9000`, `GCLM_API_KEY=...`) and by its `gclm serve` flag (`--port`). The CLI
builds its settings with `ServerSettings.from_env(**cli_overrides)`: explicit overrides win
over the environment, which wins over the defaults below.

Each setting is written once, with its concern and its help (`setting(...)`): the CLI's flags
and their help (`add_arguments`) and the configuration page (docs/settings.md, `settings_page`;
`python -m gclm.server.settings` prints it) are generated from them.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from gclm.compiler import ADDITIONAL_PROPERTIES
from gclm.paths import default_cache_dir

ENV_PREFIX = "GCLM_"

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DTYPES = ("auto", "float32", "float16", "bfloat16")
ENGINES = ("transformers", "vllm")
ON_OFF = ("on", "off")
SWITCHES = ("auto", "on", "off")
EXECUTOR_BACKENDS = ("mp", "ray", "uni", "external_launcher")
REASONING_PARSERS = ("deepseek_r1", "qwen3")  # server/openai/reasoning.py PARSERS' names

# The concerns settings are grouped by: their CLI help groups and docs/settings.md sections.
HTTP, AUTH, ENGINE, COMPILE, CACHE, BUDGET, VLLM = (
    "HTTP",
    "auth",
    "engine",
    "compile",
    "cache",
    "budget",
    "vLLM",
)
CONCERNS = {
    HTTP: "How the server listens, and what it accepts from a connection.",
    AUTH: "API keys (server/http/keys.py).",
    ENGINE: "The engine behind the API: the model, its device, batching and prefill.",
    COMPILE: "The constraint compiler's processes and their limits.",
    CACHE: "Where compiled tables (and converted models) are kept.",
    BUDGET: "`max_tokens` for a request that sets neither `max_tokens` nor "
    "`max_completion_tokens`.",
    VLLM: "vLLM's own options, used with `--engine vllm` only.",
}

RESPONSES = "responses"
CONCERNS[RESPONSES] = "Stored responses of the Responses API (`store`, `previous_response_id`)."


def setting(
    default: Any,
    concern: str,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    shown: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A ServerSettings field with what its flag and its docs row say: its `concern`,
    `help`, accepted `choices`, and `shown` (the default as the docs write it, where the
    value alone would not say it)."""
    meta = {"concern": concern, "help": help, "choices": choices, "metavar": metavar}
    meta["shown"] = shown
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def switch(value: str) -> bool | None:
    """An `on`/`off`/`auto` setting as the engines take it: True, False, or None for `auto`
    (the engine decides)."""
    return {"on": True, "off": False, "auto": None}[value]


def _check_choices(settings: ServerSettings) -> None:
    """Every setting declared with `choices` holds one of them (or None, where None is its
    default). Raises ValueError naming the setting and what it accepts."""
    for f in fields(settings):
        choices = f.metadata["choices"]
        value = getattr(settings, f.name)
        if choices is None or value in choices or (value is None and f.default is None):
            continue
        raise ValueError(_choice_error(f.name, choices, value))


def _choice_error(name: str, choices: tuple[str, ...], value: object) -> str:
    """`fast_forward must be on or off, got 'x' (--fast-forward, GCLM_FAST_FORWARD).`"""
    *rest, last = choices
    accepted = f"{', '.join(rest)} or {last}" if rest else last
    return f"{name} must be {accepted}, got {value!r} ({_flag(name)}, {ENV_PREFIX}{name.upper()})."


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
        raise ValueError(_choice_error("distributed_executor_backend", EXECUTOR_BACKENDS, backend))


@dataclass(frozen=True)
class ServerSettings:
    """How the server listens, which model it serves, and its per-request defaults, by
    concern (HTTP, auth, engine, compile, cache, budget, vLLM); each field's help and group
    also make its `gclm serve` flag (`add_arguments`) and its row in docs/settings.md
    (`settings_page`).

    Budget defaults (the `max_tokens` used when a request sets neither `max_tokens` nor
    `max_completion_tokens`):
      - unconstrained requests get `default_max_tokens`;
      - constrained requests get `max(constrained_max_tokens_floor,
        constrained_max_tokens_factor * table.min_tokens)`, so a default budget always
        leaves room to finish the constraint.

    Raises ValueError (from the constructor) naming the bad field and the accepted values.
    """

    # --- HTTP: how the server listens and what it accepts ---
    host: str = setting("127.0.0.1", HTTP, "address to bind")
    port: int = setting(8000, HTTP, "port")
    max_body_size: int = setting(16, HTTP, "MiB per request body; larger bodies get `413`")
    # Connections (server/http/connections.py): a request's headers and its body must each
    # arrive within their timeout, an idle kept-alive connection is closed, and past
    # max_connections open connections a request gets 503.
    header_timeout: float = setting(
        10.0,
        HTTP,
        "seconds for a request's headers to arrive; then `408` and the connection closed",
    )
    body_timeout: float = setting(
        60.0,
        HTTP,
        "seconds for a request's body to arrive after its headers; then the connection is closed",
    )
    keep_alive_timeout: float = setting(
        5.0, HTTP, "seconds an idle kept-alive connection stays open"
    )
    shutdown_timeout: float = setting(
        5.0,
        HTTP,
        "seconds SIGTERM waits for requests in flight; then they are closed, and the compile "
        "workers and threads stop with the server",
    )
    max_connections: int = setting(
        1024,
        HTTP,
        "open connections; a request past them gets `503` (`too_many_connections`, with "
        "`Retry-After`)",
    )
    # Browsers (server/http/browsers.py): origins allowed by CORS, comma-separated ("*": any;
    # None: CORS off), and the Host names the server answers to (None: any).
    cors_origins: str | None = setting(
        None,
        HTTP,
        "origins a browser page may call from, comma-separated (`*`: any)",
        shown="none (CORS off)",
    )
    allowed_hosts: str | None = setting(
        None,
        HTTP,
        "`Host` names answered, comma-separated; others get `400` (`invalid_host`)",
        shown="any",
    )
    # --- auth (server/http/keys.py) ---
    api_key: str | None = setting(
        None, AUTH, "require `Authorization: Bearer KEY` on every route but `/health`"
    )
    api_keys_file: Path | None = setting(
        None,
        AUTH,
        "several keys, one a line: `KEY [name=N] [rpm=N] [concurrent=N] [tokens_per_minute=N] "
        "[compile_seconds_per_minute=S]`",
        metavar="FILE",
    )
    public_metrics: str = setting(
        "off", AUTH, "`on`: `/metrics` needs no key (for a scraper)", choices=ON_OFF
    )
    # --- engine: which model, on what, and how it batches ---
    engine: str = setting(
        "transformers",
        ENGINE,
        "the engine behind the API: gclm's own on transformers, or vLLM (needs vLLM's "
        "environment; its options: the vLLM group)",
        choices=ENGINES,
    )
    model: str | None = setting(
        None, ENGINE, "hub id or local directory", shown="embedded SmolLM2-135M-Instruct"
    )
    device: str = setting("auto", ENGINE, "`auto` (cuda, mps, cpu), `cpu`, `cuda`, `cuda:N`, `mps`")
    dtype: str = setting(
        "auto",
        ENGINE,
        "`auto` (bf16 on CUDA and on CPUs with bf16 instructions, else fp32), `float32`, "
        "`float16`, `bfloat16`",
    )
    max_batch: int = setting(
        0,
        ENGINE,
        "sequences decoded together; `0`: as many KV slots as `--kv-memory` holds, at most 64 "
        "(`--engine vllm`: its `max_num_seqs`, default 8)",
    )
    kv_memory: int = setting(
        0,
        ENGINE,
        "MiB for the KV cache; `0`: half the free GPU memory, or a quarter of the available RAM, "
        "at most 8 GiB",
    )
    fast_forward: str = setting(
        "on",
        ENGINE,
        "feed the text a constraint forces as drafts checked in one forward pass "
        "(masking/drafts.py)",
        choices=ON_OFF,
    )
    queue_size: int = setting(
        64,
        ENGINE,
        "sequences that may wait beyond the free KV slots before `429` (`queue_full`, with "
        "`Retry-After`)",
    )
    max_num_batched_tokens: int = setting(
        0,
        ENGINE,
        "positions one engine step computes, running rows and prompt chunks together (a longer "
        "prompt is prefilled over several steps); `0`: 512 on the CPU, 2048 on a GPU",
    )
    max_step_seconds: float = setting(
        1.0,
        ENGINE,
        "while streams decode, prompt chunks small enough that a step takes about this long "
        "(server/engine/transformers/pace.py); `0`: off",
    )
    prefill_thread: str = setting(
        "auto",
        ENGINE,
        "prefill long prompts on a thread of their own beside the decoding streams "
        "(server/engine/transformers/side_prefill.py); `auto`: on a CPU with a core to spare",
        choices=SWITCHES,
    )
    reasoning_parser: str | None = setting(
        None,
        ENGINE,
        "`qwen3` or `deepseek_r1`: the model thinks between `<think>` and `</think>` before it "
        "answers (server/openai/reasoning.py)",
        choices=REASONING_PARSERS,
        shown="off",
    )
    chat_template: Path | None = setting(
        None,
        ENGINE,
        "a Jinja chat template file used instead of the model's",
        metavar="FILE",
        shown="the model's",
    )
    # --- compile: the constraint compiler's processes and limits ---
    compile_timeout: float = setting(
        10.0,
        COMPILE,
        "seconds a request may wait for its compile, time in the compile queue included",
    )
    compile_workers: int = setting(
        0, COMPILE, "compile processes at normal priority; `0`: one per CPU core, 2 to 8"
    )
    compile_queue: int = setting(
        64, COMPILE, "compiles waiting for a worker before `429` (`compiler_busy`)"
    )
    compile_memory: int = setting(4096, COMPILE, "MiB of address space per compile process")
    compile_cpu_limit: float = setting(
        60.0,
        COMPILE,
        "CPU seconds one compile may use, in the background past its request's timeout too; "
        "past it a `400` (`compile_limit`), remembered",
    )
    first_mask: str = setting(
        "lazy",
        COMPILE,
        "`lazy`: a new constraint's requests start on masks walked state by state, on a byte "
        "DFA grown from the regex's NFA as they read it (compiler/grown/lazy_dfa.py), or where the "
        "NFA is not built here on the byte DFA a worker compiles alone "
        "(compiler/service/first_mask.py); "
        "the whole table is compiled only for a request that needs it (thinking, a tight "
        "budget). `lazy-outlines`: the same, always on the worker's byte DFA (outlines-core's, "
        "whole). `whole`: every request waits for the whole table (`--engine vllm` always waits)",
        choices=("lazy", "lazy-outlines", "whole"),
    )
    additional_properties: str = setting(
        "declared",
        COMPILE,
        "JSON Schema objects with declared properties and no `additionalProperties`: "
        "`declared` generates the declared properties only, `spec` also accepts other keys "
        "before, between and after them, as the specification allows (larger automata, "
        "slower compiles), tool "
        "parameters included; a request's `structured_outputs.disable_additional_properties` "
        "decides for itself",
        choices=ADDITIONAL_PROPERTIES,
    )
    # --- cache: compiled tables ---
    cache_dir: Path = setting(
        None,
        CACHE,
        "converted models and compiled tables",
        factory=default_cache_dir,
        shown="`~/.cache/gclm`",
    )
    cache_memory: int = setting(
        512, CACHE, "MiB for everything cached per schema in memory: tables, mask rows, failures"
    )
    cache_disk: int = setting(
        2048,
        CACHE,
        "MiB of compiled tables under `<cache-dir>/tables`, least recently used evicted; `0`: "
        "no disk cache",
    )
    # --- budget: max_tokens when a request sets none ---
    default_max_tokens: int = setting(256, BUDGET, "max_tokens of an unconstrained request")
    constrained_max_tokens_floor: int = setting(
        512, BUDGET, "a constrained request's max_tokens is at least this"
    )
    constrained_max_tokens_factor: int = setting(
        2, BUDGET, "... and at least this many times the constraint's minimum"
    )
    # --- vLLM: its own options, with --engine vllm only ---
    tensor_parallel_size: int = setting(1, VLLM, "split every layer over N GPUs (one node)")
    pipeline_parallel_size: int = setting(1, VLLM, "split the layers into N stages (GPUs or nodes)")
    distributed_executor_backend: str | None = setting(
        None,
        VLLM,
        "`mp` (one node), `ray` (several nodes: start a Ray cluster first), `uni`, "
        "`external_launcher`",
        choices=EXECUTOR_BACKENDS,
        shown="vLLM's",
    )
    max_model_len: int | None = setting(None, VLLM, "context length", shown="the model's")
    gpu_memory_utilization: float = setting(0.9, VLLM, "share of each GPU vLLM may take")
    prefix_caching: str = setting(
        "auto", VLLM, "vLLM's automatic prefix caching (`auto`: vLLM's default)", choices=SWITCHES
    )
    enforce_eager: str = setting(
        "off",
        VLLM,
        "`on`: no torch.compile / CUDA graphs (starts faster, decodes slower)",
        choices=SWITCHES,
    )
    # --- responses: the Responses API's stored responses (server/openai/responses/store.py) ---
    responses_db: str | None = setting(
        None,
        RESPONSES,
        "`sqlite:///PATH` of the stored responses' SQLite file (an absolute path: four slashes), "
        "or `off` to store none",
        shown="`<cache-dir>/responses.db`",
    )
    responses_retention: float = setting(
        30.0, RESPONSES, "days a stored response is kept, then it answers 404"
    )
    responses_max_size: int = setting(
        16,
        RESPONSES,
        "MiB of input one stored response may hold, the earlier turns of its "
        "`previous_response_id` included; a longer conversation is a `400`",
    )

    def __post_init__(self) -> None:
        _check_choices(self)
        if not self.host:
            raise ValueError("host must be a non-empty hostname or IP address, e.g. 127.0.0.1.")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port}.")
        if self.model is not None and not self.model.strip():
            raise ValueError("model must be a model id or path; leave it unset for the default.")
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be auto, cpu, mps, cuda or cuda:N, got {self.device!r}.")
        if self.dtype not in DTYPES:  # not a flag's choices: `--dtype` keeps its own metavar
            raise ValueError(_choice_error("dtype", DTYPES, self.dtype))
        for name in ("max_batch", "kv_memory"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{name} must be 0 (from the free memory) or more, got {getattr(self, name)}."
                )
        if self.max_num_batched_tokens < 0:
            raise ValueError(
                "max_num_batched_tokens must be 0 (the device's default) or more, got "
                f"{self.max_num_batched_tokens}."
            )
        if not self.max_step_seconds >= 0:  # NaN too
            raise ValueError(
                f"max_step_seconds must be 0 (off) or more, got {self.max_step_seconds}."
            )
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
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout", "shutdown_timeout"):
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
        check_vllm_options(self)
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank; leave it unset to disable authentication.")
        _check_responses(self)
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

    # The on/off/auto settings as the server's parts take them: the strings stay what the
    # flags, the variables and the docs say; these are their values.
    @property
    def public_metrics_on(self) -> bool:
        """`/metrics` needs no key."""
        return bool(switch(self.public_metrics))

    @property
    def fast_forward_on(self) -> bool:
        """Forced text is fed as drafts."""
        return bool(switch(self.fast_forward))

    @property
    def prefill_thread_on(self) -> bool | None:
        """Long prompts prefill on a thread of their own (None: `auto`, the engine decides)."""
        return switch(self.prefill_thread)

    @property
    def prefix_caching_on(self) -> bool | None:
        """vLLM's prefix caching (None: `auto`, vLLM's default)."""
        return switch(self.prefix_caching)

    @property
    def enforce_eager_on(self) -> bool:
        """vLLM runs without torch.compile and CUDA graphs (`auto`: vLLM's default, off)."""
        return bool(switch(self.enforce_eager))

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag per setting (`--kv-memory` for kv_memory), one help group per concern.

    Every flag's default is None, so that an unset flag falls through to the environment
    and then to the setting's default (`ServerSettings.from_env`).
    """
    groups: dict[str, Any] = {}
    for f in fields(ServerSettings):
        meta = f.metadata
        concern = meta["concern"]
        if concern not in groups:
            groups[concern] = parser.add_argument_group(concern, _plain(CONCERNS[concern]))
        kind = _field_type(ServerSettings, f.name)
        kwargs: dict[str, Any] = {"help": f"{_plain(meta['help'])} (default: {_shown(f, False)})"}
        if kind in ("int", "float"):
            kwargs["type"] = int if kind == "int" else float
        elif kind == "Path":
            kwargs["type"] = Path
        if meta["choices"] is not None:
            kwargs["choices"] = meta["choices"]
        if meta["metavar"] is not None:
            kwargs["metavar"] = meta["metavar"]
        groups[concern].add_argument(_flag(f.name), **kwargs)


def settings_page() -> str:
    """docs/settings.md: every setting's flag, variable, default and meaning, by concern."""
    lines = [
        "# Settings",
        "",
        "<!-- Generated from server/settings.py by `python -m gclm.server.settings`; "
        "tests/server/test_settings_page.py holds this page to it. -->",
        "",
        "Every option of `gclm serve` can also be set by an environment variable: `GCLM_` and "
        "the option's name in upper case, with underscores (`--kv-memory 2048` is "
        "`GCLM_KV_MEMORY=2048`). A flag wins over the variable, which wins over the default. "
        "`gclm serve --help` prints the same options, grouped the same way.",
    ]
    by_concern: dict[str, list[Field[Any]]] = {}
    for f in fields(ServerSettings):
        by_concern.setdefault(f.metadata["concern"], []).append(f)
    for concern, members in by_concern.items():
        lines += ["", f"## {concern}", "", CONCERNS[concern], ""]
        lines += ["| flag | env | default | meaning |", "|---|---|---|---|"]
        for f in members:
            meaning = f.metadata["help"].replace("|", "\\|")
            choices = f.metadata["choices"]
            if choices is not None and not any(f"`{c}`" in meaning for c in choices):
                meaning += " (" + ", ".join(f"`{c}`" for c in choices) + ")"
            env = ENV_PREFIX + f.name.upper()
            lines.append(f"| `{_flag(f.name)}` | `{env}` | {_shown(f, True)} | {meaning} |")
    return "\n".join(lines) + "\n"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _plain(text: str) -> str:
    """Help text for a terminal: the docs' backquotes dropped, % escaped for argparse."""
    return text.replace("`", "").replace("%", "%%")


def _shown(f: Field[Any], markdown: bool) -> str:
    """The default as the docs (markdown) or the CLI help write it."""
    shown = f.metadata["shown"]
    if shown is None:
        shown = "none" if f.default is None else f"`{f.default}`"
    return shown if markdown else _plain(shown)


if __name__ == "__main__":
    print(settings_page(), end="")


def _check_responses(settings: ServerSettings) -> None:
    """The stored responses' settings (a bad database URL is one line from the CLI)."""
    if settings.responses_db not in (None, "off"):
        sqlite_path(settings.responses_db)
    if not settings.responses_retention > 0:
        raise ValueError(
            "responses_retention must be a positive number of days, "
            f"got {settings.responses_retention}."
        )
    if settings.responses_max_size < 1:
        raise ValueError(
            f"responses_max_size must be at least 1 MiB, got {settings.responses_max_size}."
        )


def sqlite_path(url: str) -> Path:
    """The file of a `sqlite:///PATH` URL (`sqlite:////abs/path`, `sqlite:///rel/path`).

    Raises ValueError for another scheme, saying what is supported.
    """
    scheme, sep, rest = url.partition("://")
    if scheme != "sqlite" or not sep or not rest.startswith("/") or rest == "/":
        raise ValueError(
            f"responses_db must be sqlite:///PATH or off, got {url[:80]!r}: gclm stores "
            "responses in SQLite only (no PostgreSQL or other driver is supported)."
        )
    return Path(rest[1:]).expanduser()
