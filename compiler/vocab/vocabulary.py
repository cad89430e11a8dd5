"""A tokenizer's tokens as the bytes they decode to, for outlines-core.

Tokenizers store tokens in an encoded alphabet: byte-level BPE (GPT-2, Llama 3, Qwen,
SmolLM) writes each byte as a printable character (`Ġ` is a space, `Ċ` a newline);
SentencePiece writes a space as `▁` and raw bytes as `<0xNN>`. outlines-core matches the
regex against the token's real bytes, so passing the encoded strings compiles without
complaint and gives wrong masks.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import outlines_core

_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: printable character -> byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


BYTE_DECODER = _gpt2_byte_decoder()


def byte_level_bytes(token: str) -> bytes | None:
    """Bytes of a byte-level BPE token, or None if it is not in the GPT-2 alphabet."""
    try:
        return bytes(BYTE_DECODER[c] for c in token)
    except KeyError:
        return None


def sentencepiece_bytes(token: str) -> bytes:
    """Bytes of a SentencePiece token: `<0xNN>` is one byte, `▁` is a space."""
    m = _SPM_BYTE.fullmatch(token)
    if m:
        return bytes([int(m.group(1), 16)])
    return token.replace("▁", " ").encode()


def detect_scheme(tokenizer: Any) -> str:
    """'byte_level', 'sentencepiece' or 'plain', from the fast tokenizer's decoder, else
    from the vocabulary's spelling."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
        if '"ByteLevel"' in decoder:
            return "byte_level"
        if any(k in decoder for k in ('"ByteFallback"', '"Metaspace"', "\\u2581")):
            return "sentencepiece"
    vocab = tokenizer.get_vocab()
    spm = sum(t.startswith("▁") or bool(_SPM_BYTE.fullmatch(t)) for t in vocab)
    gpt2 = sum(t.startswith("Ġ") for t in vocab)
    if spm > gpt2:
        return "sentencepiece"
    return "byte_level" if gpt2 else "plain"


@dataclass(frozen=True, eq=False)
class TokenVocabulary:
    """Token id -> real bytes, for every id below `size`; None for ids left out
    (special tokens, EOS, tokens with no bytes)."""

    token_bytes: tuple[bytes | None, ...]
    eos_token_id: int
    scheme: str

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenVocabulary:
        """Build from any Hugging Face tokenizer (fast or slow)."""
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError(
                "The tokenizer has no eos_token_id; set tokenizer.eos_token before compiling."
            )
        scheme = detect_scheme(tokenizer)
        special = set(tokenizer.all_special_ids)
        added = {
            i: t.content
            for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
            if not t.special
        }
        special |= {
            i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special
        }
        vocab = tokenizer.get_vocab()
        size = max(max(vocab.values()) + 1, len(tokenizer))
        table: list[bytes | None] = [None] * size
        for token, i in vocab.items():
            if i in special or i == eos:
                continue
            if i in added:
                data: bytes | None = added[i].encode()  # added tokens are stored as plain text
            elif scheme == "byte_level":
                data = byte_level_bytes(token)
            elif scheme == "sentencepiece":
                data = sentencepiece_bytes(token)
            else:
                data = token.encode()
            table[i] = data or None
        return cls(tuple(table), int(eos), scheme)

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, int]:
        """Each token's bytes -> its id (the lowest id where bytes repeat), EOS aside; made
        once per vocabulary (~60 ms for 49k tokens)."""
        found: dict[bytes, int] = {}
        for i, data in enumerate(self.token_bytes):
            if data and i != self.eos_token_id:
                found.setdefault(bytes(data), i)
        return found

    @cached_property
    def fingerprint(self) -> str:
        """sha256 over every kept token's id and bytes, plus EOS and the size."""
        h = hashlib.sha256(f"{self.size}:{self.eos_token_id}:".encode())
        for i, data in enumerate(self.token_bytes):
            if data is not None:
                h.update(i.to_bytes(4, "little") + len(data).to_bytes(4, "little") + data)
        return h.hexdigest()

    @cached_property
    def outlines(self) -> outlines_core.Vocabulary:
        """The outlines-core Vocabulary (built once; converting costs ~0.1 s)."""
        return self.to_outlines()

    def to_outlines(self) -> outlines_core.Vocabulary:
        by_bytes: dict[bytes, list[int]] = {}
        for i, data in enumerate(self.token_bytes):
            if data is not None:
                by_bytes.setdefault(data, []).append(i)
        return outlines_core.Vocabulary(self.eos_token_id, by_bytes)

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes[i] or b"" for i in ids).decode("utf-8", "replace")
