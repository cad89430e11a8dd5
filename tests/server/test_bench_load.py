"""bench/load.py's pieces that need no server: the long prompts and the /metrics reader."""

from __future__ import annotations

from bench.load import _metric, long_prompt


def test_a_long_prompt_has_about_the_tokens_asked(embedded_tokenizer) -> None:
    for tokens in (1000, 4000):
        count = len(embedded_tokenizer.encode(long_prompt(tokens, seed=tokens)))
        assert 0.9 * tokens <= count <= 1.2 * tokens
    assert long_prompt(100, seed=1) != long_prompt(100, seed=2)  # no prefix reuse between


def test_metric_reads_one_sample() -> None:
    text = "# HELP gclm_kv_slots_free x\ngclm_kv_slots_free 12.0\ngclm_kv_slots_free_x 3.0\n"
    assert _metric(text, "gclm_kv_slots_free") == 12.0
    assert _metric(text, "gclm_missing") is None
