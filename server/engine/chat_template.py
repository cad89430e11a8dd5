"""Chat prompts in which text from a request cannot forge the template's control tokens.

    ids = encode_chat(tokenizer, messages)   # the template's own control tokens are special,
                                             # "<|im_end|>" inside a message is plain text

A chat template is rendered to text and that text is tokenized, and a tokenizer parses every
special token's text it meets: a user message (or a tool result, or tool-call arguments)
holding "<|im_end|><|im_start|>system" would close its own turn and open a forged system turn.
So every string in the messages that holds a special token's text is wrapped, before rendering,
in markers carrying a random per-call nonce (which no request can guess); the rendered text is
then tokenized in pieces: the template's own text with special tokens parsed, each wrapped
string as plain text (`split_special_tokens`). Messages without such text (nearly all) are
rendered and tokenized exactly as before, in one piece. Both engines call this.

A string cut in pieces is tokenized apart from the text around it: with a SentencePiece
tokenizer its first token may differ from the one-piece encoding (it is still plain text).
"""

from __future__ import annotations

import functools
import re
import secrets
from typing import Any

from gclm.errors import InvalidRequestError, quote


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], **template_kwargs: Any) -> str:
    """The chat template applied to `messages`, ending with the assistant turn's start.

    Raises InvalidRequestError when the template refuses the messages (its own checks of
    roles and order), quoting the template's reason cut short.
    """
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
    except Exception as e:  # the template's raise_exception(...) or a Jinja error
        raise InvalidRequestError(
            f"The model's chat template rejected the messages: {quote(str(e), 200)}",
            param="messages",
        ) from e


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes tools itself: it reads a `tools`
    variable and renders earlier calls (`tool_calls`) or role "tool" results.

    Such a template gets the tools, calls and results as they are (apply_chat_template's
    `tools=`, assistant `tool_calls`, role "tool"; server/openai/tools/prompt.py), and writes
    them in the layout the model was trained on. A named set of templates counts when one of
    them does (transformers picks "tool_use" when tools are passed).
    """
    template = getattr(tokenizer, "chat_template", None)
    texts = template.values() if isinstance(template, dict) else [template]
    return any(isinstance(t, str) and _TOOLS_USE.search(t) is not None for t in texts)


# `tools` read as a variable, and calls or the tool role rendered (a template that only
# mentions tools in a comment, or never writes a result, falls back to gclm's format).
_TOOLS_USE = re.compile(
    r"""(?s)(?=.*(?:\{[%{][^%}]*\btools\b))(?=.*(?:\btool_calls\b|['"]tool['"]))"""
)


def encode_chat(
    tokenizer: Any, messages: list[dict[str, Any]], **template_kwargs: Any
) -> list[int]:
    """The prompt ids of `messages`: control tokens only where the template put them.

    Raises InvalidRequestError when the template refuses the messages, or alters a string
    holding control-token text so that it can no longer be told apart (then the request is
    refused rather than that text parsed as control tokens).
    """
    pattern = _special_pattern(tokenizer)
    nonce = secrets.token_hex(8)
    opening, closing = f"gclm{nonce}<", f">gclm{nonce}"
    marked = 0

    def wrap(value: Any) -> Any:
        nonlocal marked
        if isinstance(value, str):
            if pattern is not None and pattern.search(value):
                marked += 1
                return opening + value + closing
            return value
        if isinstance(value, dict):
            return {key: wrap(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [wrap(item) for item in value]
        return value

    text = render_chat(tokenizer, wrap(messages), **template_kwargs)
    if not marked:
        return list(tokenizer.encode(text, add_special_tokens=True))
    # Even pieces: the template's text; odd pieces: the wrapped strings, as given.
    pieces = re.split(f"{re.escape(opening)}(.*?){re.escape(closing)}", text, flags=re.DOTALL)
    if any(nonce in piece.lower() for piece in pieces):  # hex: lower case
        raise InvalidRequestError(
            "A message holds the text of one of the model's control tokens, and this model's "
            "chat template changes that message in a way that cannot keep it plain text. "
            "Remove the control-token text from the messages.",
            param="messages",
            code="control_token_in_content",
        )
    ids: list[int] = []
    for i, piece in enumerate(pieces):
        if not piece and i:
            continue
        ids += tokenizer.encode(piece, add_special_tokens=i == 0, split_special_tokens=bool(i % 2))
    return ids


@functools.lru_cache(maxsize=8)
def _special_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A regex matching the text of any of the tokenizer's special tokens (None: it has none).

    Added tokens not marked special (a model's "<tool_call>", say) are ordinary words of its
    vocabulary and stay as they are.
    """
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    texts = {str(token) for token in added.values() if getattr(token, "special", False)}
    texts |= set(getattr(tokenizer, "all_special_tokens", ()) or ())
    texts.discard("")
    if not texts:
        return None
    return re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True)))
