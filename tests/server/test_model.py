"""Loading the model: device and dtype resolution, load errors, and the embedded model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gclm.server.engine.model_loader as model_module
from gclm.errors import ModelLoadError
from gclm.server.engine.model_loader import (
    EMBEDDED_MODEL_ID,
    LoadedModel,
    default_cache_dir,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.fixture
def one_cuda_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


# --- resolve_device -----------------------------------------------------------------------


def test_auto_device_is_cpu_without_accelerators(no_gpu: None) -> None:
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_device_prefers_cuda_with_an_index(one_cuda_gpu: None) -> None:
    assert resolve_device("auto") == torch.device("cuda", 0)


def test_auto_device_falls_back_to_mps(no_gpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")


def test_explicit_cpu() -> None:
    assert resolve_device("cpu") == torch.device("cpu")


def test_explicit_cuda_gets_an_index(one_cuda_gpu: None) -> None:
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.parametrize("name", ["gpu", "xla", "", "cuda:x"])
def test_unknown_device_names_the_choices(name: str) -> None:
    with pytest.raises(ModelLoadError, match=r"Unknown device .*'auto', 'cpu', 'cuda'"):
        resolve_device(name)


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_unavailable_cuda_suggests_cpu(no_gpu: None, name: str) -> None:
    with pytest.raises(ModelLoadError, match="CUDA is not available.*--device cpu"):
        resolve_device(name)


def test_missing_cuda_index_lists_the_real_ones(one_cuda_gpu: None) -> None:
    with pytest.raises(ModelLoadError, match=r"'cuda:3' does not exist.*1 CUDA device.*cuda:0"):
        resolve_device("cuda:3")


def test_unavailable_mps_suggests_cpu(no_gpu: None) -> None:
    with pytest.raises(ModelLoadError, match="MPS .* not available.*--device cpu"):
        resolve_device("mps")


# --- resolve_dtype ------------------------------------------------------------------------


def test_auto_dtype_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "cpu_has_bf16", lambda: True)
    assert resolve_dtype("auto", torch.device("cpu")) is torch.bfloat16
    monkeypatch.setattr(model_module, "cpu_has_bf16", lambda: False)
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("mps")) is torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", torch.device("cuda", 0)) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", torch.device("cuda", 0)) is torch.float16


@pytest.mark.parametrize(
    ("name", "expected"),
    [("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)],
)
def test_explicit_dtype(name: str, expected: torch.dtype) -> None:
    assert resolve_dtype(name, torch.device("cpu")) is expected


@pytest.mark.parametrize("name", ["fp16", "float64", "int8", "half"])
def test_unknown_dtype_names_the_choices(name: str) -> None:
    with pytest.raises(ModelLoadError, match=r"Unknown dtype .*'float16', 'bfloat16' or 'float32'"):
        resolve_dtype(name, torch.device("cpu"))


# --- cache dir and load errors --------------------------------------------------------------


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GCLM_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("GCLM_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "gclm"


def test_missing_local_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no-model-here"
    with pytest.raises(ModelLoadError, match="no such directory.*omit --model") as caught:
        load_model(str(missing))
    assert str(missing) in caught.value.message
    assert caught.value.status_code == 500


@pytest.mark.parametrize("name", ["./typo", "~/gclm-no-such-model", "../a/b/c"])
def test_path_like_names_never_reach_the_hub(name: str) -> None:
    with pytest.raises(ModelLoadError, match="no such directory"):
        load_tokenizer(name)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_file_instead_of_directory(tmp_path: Path) -> None:
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file, not a model directory"):
        load_model(str(weights))


def test_uncached_hub_id_offline_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="cannot be reached.*HF_HUB_OFFLINE"):
        load_model("gclm-tests/no-such-model")


# --- the embedded model (converted once into the default cache dir, then reused) ----------


@pytest.fixture(scope="module")
def embedded() -> LoadedModel:
    # The default cache dir on purpose: the first run converts the GGUF (~30 s) and every
    # later run, and every other test module that loads the model, reuses the conversion.
    return load_model(None, device="cpu", dtype="float32")


def _greedy(loaded: LoadedModel, prompts: list[str], new_tokens: int) -> list[list[int]]:
    batch = loaded.tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = loaded.model.generate(
            **batch,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # keep every row the same length to compare
            do_sample=False,
            pad_token_id=loaded.tokenizer.pad_token_id,
        )
    return out[:, batch["input_ids"].shape[1] :].tolist()


@pytest.mark.e2e
def test_embedded_model_loads_ready_for_inference(embedded: LoadedModel) -> None:
    assert embedded.model_id == EMBEDDED_MODEL_ID
    assert embedded.device == torch.device("cpu")
    assert embedded.dtype is torch.float32
    assert not embedded.model.training
    assert next(embedded.model.parameters()).dtype is torch.float32
    assert len(embedded.tokenizer) <= embedded.model.config.vocab_size
    assert embedded.tokenizer.model_max_length == embedded.model.config.max_position_embeddings


@pytest.mark.e2e
def test_embedded_tokenizer_keeps_eos_and_chat_template(embedded: LoadedModel) -> None:
    tokenizer = embedded.tokenizer
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id == embedded.model.generation_config.eos_token_id
    assert tokenizer.pad_token is not None
    assert tokenizer.padding_side == "left"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.e2e
def test_embedded_greedy_generation_is_deterministic(embedded: LoadedModel) -> None:
    prompt = embedded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    first = _greedy(embedded, [prompt], 6)
    assert first == _greedy(embedded, [prompt], 6)
    assert "Paris" in embedded.tokenizer.decode(first[0])
    # Left padding: the same prompt beside a longer one in a batch continues the same way.
    longer = prompt.replace("France?", "France, the country in western Europe?")
    assert _greedy(embedded, [prompt, longer], 6)[0] == first[0]


@pytest.mark.e2e
def test_tokenizer_alone_loads_from_the_same_cache(embedded: LoadedModel) -> None:
    tokenizer = load_tokenizer(None)
    assert tokenizer.get_vocab() == embedded.tokenizer.get_vocab()
    assert tokenizer.chat_template == embedded.tokenizer.chat_template
    assert tokenizer.padding_side == "left"
