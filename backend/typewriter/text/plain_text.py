"""Client text is text: a control token a client types, in a message, in an answer's start, in a tool's name or a
parameter's (a dictionary key), is encoded as plain text, never as the token the chat template writes itself.

transformers marks control tokens in string values for `apply_chat_template(sanitize_control_tokens=True)`; this
marks dictionary keys the same way and encodes a loose piece of text as a message's content is encoded, with two of
transformers' helpers (tests/text/test_plain_text.py holds them to it).
"""

from __future__ import annotations

import re
from typing import Any

from transformers.utils.chat_template_utils import (
    _get_control_token_patterns,
    encode_marked_chat,
    mark_control_tokens,
)


class PlainText:
    def __init__(self, hf: Any):
        """`hf`: the transformers tokenizer that renders the chat template."""
        self._hf = hf
        control: re.Pattern[str] = _get_control_token_patterns(tuple(hf._get_control_tokens(hf.chat_template)))[0]
        self._control = control

    def keys(self, value: Any) -> Any:
        """`value` (messages, tools: JSON-shaped) with the control tokens in its dictionary keys marked; string
        values are left to `apply_chat_template`, which marks them itself."""
        if isinstance(value, dict):
            return {mark_control_tokens(key, self._control) if isinstance(key, str) else key: self.keys(inner)
                    for key, inner in value.items()}
        if isinstance(value, list | tuple):
            return [self.keys(inner) for inner in value]
        return value

    def encode(self, text: str) -> list[int]:
        """`text`'s token ids as a message's content would be encoded: control tokens in it as plain text."""
        ids: list[int] = encode_marked_chat(self._hf, mark_control_tokens(text, self._control))
        return ids
