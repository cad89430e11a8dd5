"""The embedded model with `<think>` and `</think>` as single vocabulary tokens, for benches
that run vLLM's own reasoning parser.

vLLM's `deepseek_r1` / `qwen3` parsers look their markers up in the vocabulary and refuse a
model without them; SmolLM2 has none (`</think>` is 3 plain-text tokens there). This builds,
once, a copy of the embedded model with both markers added as tokens (as Qwen3 has them:
added, not special, so they stay in decoded text) and the embeddings grown by two rows, each
the mean of the rows of the marker's plain-text tokens (`</`, `think`, `>`): tied, so the
output head grows with them. (A row at the mean of the whole vocabulary makes the model end
its turn right after `<think>`: EOS gets 83% of the first step.) The chat template
is tests/server/templates/think.jinja: its `<think>\\n` now tokenizes as the new token.

    directory = think_model_dir()   # ~/.cache/gclm/models/SmolLM2-135M-Instruct-think-v1

It lives under gclm's cache directory (not in git); the same directory is served by gclm and
by vLLM, so both see the same weights, tokenizer and template.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1] / "tests" / "server" / "templates" / "think.jinja"
MARKERS = ("<think>", "</think>")
# Part of the directory's name: bump it when the build changes, so an old copy is not reused.
_VERSION = 2


def think_model_dir(cache_dir: Path | None = None) -> Path:
    """Return the thinking copy of the embedded model, building it on first use (~10 s).

    Written into a temp dir beside the target and renamed into place, so an interrupted
    build leaves nothing half-written behind.
    """
    import torch
    from transformers import AddedToken, AutoModelForCausalLM, AutoTokenizer

    from gclm.paths import default_cache_dir
    from gclm.server.engine.model_loader import EMBEDDED_MODEL_ID, embedded_model_dir

    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    target = cache_dir / "models" / f"{EMBEDDED_MODEL_ID}-think-v{_VERSION}"
    if target.is_dir():
        return target
    source = embedded_model_dir(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(source)
    pieces = [tokenizer.encode(m, add_special_tokens=False) for m in MARKERS]
    tokenizer.add_tokens([AddedToken(m, special=False, normalized=False) for m in MARKERS])
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        grown = model.get_input_embeddings().weight
        for marker, ids in zip(MARKERS, pieces, strict=True):
            grown[tokenizer.convert_tokens_to_ids(marker)] = grown[ids].mean(dim=0)
    tokenizer.chat_template = TEMPLATE.read_text()
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared between users
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _check_markers(tmp)
        for written in tmp.iterdir():
            written.chmod(0o644)  # safetensors writes 0600; keep the cache readable to all
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # another process's copy won the rename: use it
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_markers(directory: Path) -> None:
    """Raise if a marker is not one token of the saved tokenizer (what vLLM's parsers need)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    for marker in MARKERS:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"{marker!r} is {len(ids)} tokens in {directory}, not one")
