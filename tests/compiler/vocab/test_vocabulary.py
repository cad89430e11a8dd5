"""Tokens become their real bytes: GPT-2's byte alphabet, SentencePiece's ▁ and <0xNN>."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gclm.compiler.front.constraint import Constraint
from gclm.compiler.vocab.vocabulary import BYTE_DECODER, TokenVocabulary, byte_level_bytes
from gclm.compiler.whole.compile import compile_constraint
from gclm.errors import ConstraintError


def test_gpt2_alphabet_covers_every_byte_once():
    assert sorted(BYTE_DECODER.values()) == list(range(256))
    assert byte_level_bytes("Ġthe") == b" the"
    assert byte_level_bytes("Ċ") == b"\n"
    assert byte_level_bytes("Ã©") == "é".encode()
    assert byte_level_bytes("日") is None  # not in the alphabet: an added token, as text


def _spm_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁the": 3, "▁": 4, "a": 5, "<0x0A>": 6, "<0xC3>": 7}
    vocab |= {"<0xA9>": 8, "▁a": 9}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def test_sentencepiece_space_and_byte_tokens():
    vocab = TokenVocabulary.from_tokenizer(_spm_tokenizer())
    assert vocab.scheme == "sentencepiece"
    assert vocab.eos_token_id == 2
    assert vocab.token_bytes[3] == b" the"
    assert vocab.token_bytes[4] == b" "
    assert vocab.token_bytes[6] == b"\n"
    assert vocab.token_bytes[7] == b"\xc3"
    assert vocab.token_bytes[:3] == (None, None, None)  # specials and EOS left out


def test_sentencepiece_byte_tokens_spell_multibyte_text():
    vocab = TokenVocabulary.from_tokenizer(_spm_tokenizer())
    table = compile_constraint(Constraint.regex("é"), vocab)
    assert table.min_tokens == 2  # <0xC3> then <0xA9>
    state = table.next_state(table.initial, 7)
    assert state >= 0 and table.next_state(state, 8) >= 0


def test_byte_level_specials_left_out(embedded_tokenizer, embedded_vocab):
    assert embedded_vocab.scheme == "byte_level"
    for special in embedded_tokenizer.all_special_ids:
        assert embedded_vocab.token_bytes[special] is None
    space_the = embedded_tokenizer.convert_tokens_to_ids("Ġthe")
    assert embedded_vocab.token_bytes[space_the] == b" the"


def test_leading_space_token_allowed_where_regex_wants_a_space(embedded_tokenizer, embedded_vocab):
    table = compile_constraint(Constraint.regex(r"Say the word"), embedded_vocab)
    say = embedded_tokenizer.convert_tokens_to_ids("Say")
    space_the = embedded_tokenizer.convert_tokens_to_ids("Ġthe")
    after_say = table.next_state(table.initial, say)
    assert after_say >= 0
    assert table.next_state(after_say, space_the) >= 0
    the = embedded_tokenizer.convert_tokens_to_ids("the")
    assert table.next_state(after_say, the) == -1  # "Saythe" is not in the language


def test_raw_strings_would_give_wrong_masks(embedded_tokenizer, embedded_vocab):
    """The failure this module exists for: 'Ġthe' as text never matches ' the'."""
    wrong = TokenVocabulary(
        tuple(
            None if b is None else t.encode()
            for t, b in zip(
                embedded_tokenizer.convert_ids_to_tokens(list(range(embedded_vocab.size))),
                embedded_vocab.token_bytes,
                strict=True,
            )
        ),
        embedded_vocab.eos_token_id,
        "wrong",
    )
    space_the = embedded_tokenizer.convert_tokens_to_ids("Ġthe")
    right = compile_constraint(Constraint.regex(r" the"), embedded_vocab)
    assert right.next_state(right.initial, space_the) >= 0
    # Read as text, no token of a byte-level vocabulary contains a plain space.
    with pytest.raises(ConstraintError, match="could not be compiled"):
        compile_constraint(Constraint.regex(r" the"), wrong)
    # ...and the encoded spelling compiles without complaint, to the wrong language.
    silently_wrong = compile_constraint(Constraint.regex(r"Ġthe"), wrong)
    assert silently_wrong.next_state(silently_wrong.initial, space_the) >= 0


def test_fingerprint_covers_ids_bytes_and_eos():
    base = TokenVocabulary((b"a", b"b", None), 2, "plain")
    assert base.fingerprint == TokenVocabulary((b"a", b"b", None), 2, "plain").fingerprint
    assert base.fingerprint != TokenVocabulary((b"b", b"a", None), 2, "plain").fingerprint
    assert base.fingerprint != TokenVocabulary((b"a", b"b", None, None), 3, "plain").fingerprint
    assert base.decode([0, 1, 0]) == "aba"
