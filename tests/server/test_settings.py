"""ServerSettings: defaults, GCLM_* variables, overrides, clear errors, and the on/off/auto
settings' values."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from gclm.server.settings import ON_OFF, SWITCHES, ServerSettings, switch

CHOICES = {f.name: f.metadata["choices"] for f in fields(ServerSettings) if f.metadata["choices"]}


def test_defaults() -> None:
    s = ServerSettings()
    assert (s.host, s.port, s.model, s.api_key) == ("127.0.0.1", 8000, None, None)
    assert (s.default_max_tokens, s.constrained_max_tokens_floor) == (256, 512)
    assert s.constrained_max_tokens_factor == 2
    assert s.cache_dir.name == "gclm"


def test_from_env() -> None:
    env = {
        "GCLM_PORT": "9001",
        "GCLM_API_KEY": "sk-1",
        "GCLM_COMPILE_TIMEOUT": "2.5",
        "GCLM_CACHE_DIR": "/tmp/tables",
        "GCLM_DEVICE": "cuda:1",
        "GCLM_MODEL": "",  # empty counts as unset
        "GCLM_MAX_NUM_BATCHED_TOKENS": "256",
    }
    s = ServerSettings.from_env(env)
    assert (s.port, s.api_key, s.compile_timeout) == (9001, "sk-1", 2.5)
    assert s.cache_dir == Path("/tmp/tables")
    assert s.device == "cuda:1"
    assert s.model is None
    assert s.max_num_batched_tokens == 256


def test_overrides_win_and_none_falls_through() -> None:
    s = ServerSettings.from_env({"GCLM_PORT": "9001", "GCLM_HOST": "0.0.0.0"}, port=7000, host=None)
    assert (s.port, s.host) == (7000, "0.0.0.0")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": 70000}, "port must be between 0 and 65535"),
        ({"device": "gpu"}, "device must be auto, cpu, mps, cuda or cuda:N"),
        ({"dtype": "int4"}, "dtype must be auto, float32, float16 or bfloat16"),
        ({"max_batch": -1}, "max_batch must be 0"),
        ({"kv_memory": -5}, "kv_memory must be 0"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens must be 0"),
        ({"fast_forward": "maybe"}, "fast_forward must be on or off"),
        ({"prefill_thread": "sometimes"}, "prefill_thread must be auto, on or off"),
        ({"queue_size": 0}, "queue_size must be at least 1"),
        ({"compile_timeout": 0}, "compile_timeout must be a positive"),
        ({"compile_cpu_limit": 0}, "compile_cpu_limit must be a positive"),
        ({"api_key": " "}, "api_key must not be blank"),
        ({"default_max_tokens": 0}, "default_max_tokens must be at least 1"),
        ({"compile_workers": -1}, "compile_workers must be 0"),
        ({"compile_queue": 0}, "compile_queue must be at least 1"),
        ({"compile_memory": 100}, "compile_memory must be at least 256 MiB"),
        ({"cache_memory": 0}, "cache_memory must be at least 1"),
        ({"cache_disk": -1}, "cache_disk must be 0"),
        ({"max_body_size": 0}, "max_body_size must be at least 1"),
    ],
)
def test_invalid_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerSettings(**kwargs)


def test_a_bad_choice_says_the_flag_the_variable_and_what_they_accept() -> None:
    with pytest.raises(ValueError) as raised:
        ServerSettings(fast_forward="maybe")
    assert str(raised.value) == (
        "fast_forward must be on or off, got 'maybe' (--fast-forward, GCLM_FAST_FORWARD)."
    )
    with pytest.raises(ValueError, match="first_mask must be lazy, lazy-outlines or whole"):
        ServerSettings.from_env({"GCLM_FIRST_MASK": "eager"})


@pytest.mark.parametrize("name", sorted(CHOICES))
def test_every_setting_with_choices_refuses_others(name: str) -> None:
    for accepted in CHOICES[name]:
        assert getattr(ServerSettings(**{name: accepted}), name) == accepted
    with pytest.raises(ValueError) as raised:
        ServerSettings(**{name: "nope"})
    message = str(raised.value)
    assert message.startswith(f"{name} must be ") and "got 'nope'" in message
    assert all(accepted in message for accepted in CHOICES[name])
    assert f"--{name.replace('_', '-')}, GCLM_{name.upper()}" in message


def test_none_only_where_it_is_the_default() -> None:
    assert ServerSettings(reasoning_parser=None).reasoning_parser is None
    assert ServerSettings(distributed_executor_backend=None).distributed_executor_backend is None
    with pytest.raises(ValueError, match="fast_forward must be on or off, got None"):
        ServerSettings(fast_forward=None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "expected"), [("on", True), ("off", False), ("auto", None)])
def test_switch(value: str, expected: bool | None) -> None:
    assert switch(value) is expected


def test_switches_read_as_values() -> None:
    def values(s: ServerSettings) -> tuple[bool | None, ...]:
        return (
            s.public_metrics_on,
            s.fast_forward_on,
            s.prefill_thread_on,
            s.prefix_caching_on,
            s.enforce_eager_on,
        )

    assert values(ServerSettings()) == (False, True, None, None, False)
    names = ("public_metrics", "fast_forward", "prefill_thread", "prefix_caching", "enforce_eager")
    assert values(ServerSettings(**dict.fromkeys(names, "on"))) == (True,) * 5
    assert values(ServerSettings(**dict.fromkeys(names, "off"))) == (False,) * 5
    # `auto` is None where the engine decides, and the engine's default where it takes a bool.
    assert values(ServerSettings(enforce_eager="auto"))[-1] is False


@pytest.mark.parametrize(
    "name", sorted(n for n, accepted in CHOICES.items() if accepted in (ON_OFF, SWITCHES))
)
def test_every_switch_has_its_value(name: str) -> None:
    for value in CHOICES[name]:
        got = getattr(ServerSettings(**{name: value}), f"{name}_on")
        assert got is switch(value) or (value == "auto" and got is False)


def test_unparsable_variable_names_it() -> None:
    with pytest.raises(ValueError, match="GCLM_PORT must be an integer"):
        ServerSettings.from_env({"GCLM_PORT": "eighty"})


def test_unknown_override() -> None:
    with pytest.raises(ValueError, match="Unknown setting"):
        ServerSettings.from_env({}, prot=1)


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        ServerSettings().port = 1  # type: ignore[misc]


def test_limits_from_the_environment_and_the_cli() -> None:
    from gclm.server.cli import _parser

    env = {"GCLM_COMPILE_MEMORY": "2048", "GCLM_CACHE_MEMORY": "128", "GCLM_CACHE_DISK": "0"}
    args = _parser().parse_args(
        ["serve", "--compile-workers", "3", "--compile-queue", "5", "--max-body-size", "2"]
    )
    overrides = {k: v for k, v in vars(args).items() if k != "run"}
    s = ServerSettings.from_env(env, **overrides)
    assert (s.compile_memory, s.cache_memory, s.cache_disk) == (2048, 128, 0)
    assert (s.compile_workers, s.compile_queue, s.max_body_size) == (3, 5, 2)
