"""bench/gpu.py's dry run on the CPU, its targets, and bench/gpu_bundle.py's wheel list."""

from __future__ import annotations

import importlib.metadata as metadata
import json

import pytest

from bench import gpu, gpu_bundle


def _row(constrained: float, unconstrained: float, invalid: int = 0) -> dict:
    return {
        "constrained": {"tokens_per_s": constrained, "invalid_outputs": invalid},
        "unconstrained": {"tokens_per_s": unconstrained},
        "constrained_ratio": constrained / unconstrained,
    }


def test_targets_pass_when_every_figure_meets_the_issue():
    rows = {1: _row(300.0, 310.0), 64: _row(3100.0, 3200.0)}
    assert gpu.targets(rows) == {
        "constrained_ge_0.9x_unconstrained_b1": True,
        "constrained_ge_0.9x_unconstrained_b64": True,
        "batch1_ge_280_tps": True,
        "batch64_ge_10x_batch1": True,
        "every_constrained_output_valid": True,
        "all_pass": True,
    }


def test_targets_fail_on_each_missed_figure():
    # batch 1 constrained below 280; batch 64 constrained at 0.5x and under 10x batch 1.
    rows = {1: _row(270.0, 300.0), 64: _row(1600.0, 3200.0, invalid=1)}
    got = gpu.targets(rows)
    assert got["constrained_ge_0.9x_unconstrained_b1"] is True  # 0.9x exactly
    assert got["constrained_ge_0.9x_unconstrained_b64"] is False
    assert got["batch1_ge_280_tps"] is False
    assert got["batch64_ge_10x_batch1"] is False
    assert got["every_constrained_output_valid"] is False
    assert got["all_pass"] is False


def test_targets_not_run_are_none_and_do_not_pass():
    got = gpu.targets({8: _row(100.0, 100.0)})
    assert got["batch1_ge_280_tps"] is None and got["batch64_ge_10x_batch1"] is None
    assert got["all_pass"] is False


def test_bundle_lists_what_the_gpu_machine_lacks_at_the_versions_here():
    pins = gpu_bundle.closure(gpu_bundle.ROOTS)
    assert {"fastapi", "uvicorn", "pydantic-core", "outlines-core", "gguf", "rpds-py"} <= set(pins)
    assert not set(pins) & gpu_bundle.ON_HOST  # torch, numpy... come from the machine
    assert all(metadata.version(name) == version for name, version in pins.items())


@pytest.mark.e2e  # a model (tiny, random) through the engine, ~30 s on two busy cores
def test_dry_run_measures_both_arms_and_validates_every_output(tmp_path, embedded_tokenizer):
    from transformers import LlamaConfig

    model_dir = tmp_path / "model"
    embedded_tokenizer.save_pretrained(model_dir)
    LlamaConfig(
        vocab_size=len(embedded_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=embedded_tokenizer.eos_token_id,
    ).save_pretrained(model_dir)
    out = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--weights", "random", "--model-dir", str(model_dir)]
    argv += ["--batches", "1", "2", "--max-tokens", "24", "--dtype", "float32"]
    report = gpu.main([*argv, "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report, default=str))
    assert set(report["batches"]) == {1, 2}
    for batch, row in report["batches"].items():
        for arm in ("constrained", "unconstrained"):
            assert row[arm]["outputs"] == batch  # one wave, one repeat
            assert row[arm]["tokens_per_s"] > 0
            assert 1 <= row[arm]["mean_tokens"] <= 24
        assert row["constrained"]["invalid_outputs"] == 0
        assert row["constrained_ratio"] == pytest.approx(
            row["constrained"]["tokens_per_s"] / row["unconstrained"]["tokens_per_s"]
        )
        assert 0 < row["mask_share"] < 1
    targets = report["targets"]
    assert targets["every_constrained_output_valid"] is True
    assert targets["batch64_ge_10x_batch1"] is None  # no batch of 64 in a dry run
    assert targets["all_pass"] is False
