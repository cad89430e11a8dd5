"""The vLLM engine's own logic that needs no vLLM: its options, settings and CLI refusals,
and gclm's finish reasons over vLLM's. The engine itself runs in test_e2e_vllm.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from gclm.compiler.compile import compile_constraint
from gclm.compiler.constraint import Constraint
from gclm.masking import ConstraintState
from gclm.server.interface import GenerationRequest, SamplingParams
from gclm.server.settings import ServerSettings
from gclm.server.vllm_engine import VllmEngine, VllmOptions, VllmRequest


def test_options_refuse_bad_values() -> None:
    VllmOptions(model="m", served_name="m", tensor_parallel_size=2, prefix_caching=True)
    with pytest.raises(ValueError, match="tensor_parallel_size must be at least 1"):
        VllmOptions(model="m", served_name="m", tensor_parallel_size=0)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        VllmOptions(model="m", served_name="m", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="distributed_executor_backend must be one of"):
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
    with pytest.raises(ValueError, match="engine must be one of transformers, vllm"):
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


def handle(table, tokens: list[int], budget_aware: bool = True) -> VllmRequest:
    request = GenerationRequest([1, 2], SamplingParams(max_tokens=2), table, budget_aware)
    h = VllmRequest(request, "r")
    h.state = ConstraintState(table, budget_aware=budget_aware)
    for token in tokens:
        h.state.advance(token)
    return h


def test_finish_reason_is_gclms(digits_table, embedded_vocab) -> None:
    digit = next(i for i, b in enumerate(embedded_vocab.token_bytes) if b == b"7")
    complete = handle(digits_table, [digit, digit])
    partial = handle(digits_table, [digit], budget_aware=False)
    # vLLM cut a complete output at max_tokens: complete by construction, so "stop".
    assert VllmEngine._finish_reason(complete, "length") == "stop"
    # A budget-unaware output cut mid-way stays "length".
    assert VllmEngine._finish_reason(partial, "length") == "length"
    assert VllmEngine._finish_reason(complete, "stop") == "stop"
    assert VllmEngine._finish_reason(complete, "abort") == "cancelled"
