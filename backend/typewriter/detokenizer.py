"""Token ids -> text, one token at a time, sending only text that can never be taken back.

Byte-level BPE tokens are byte strings, and one character may be spread over several tokens (an emoji is often
three or four). Each token's bytes go through an incremental UTF-8 decoder, which holds back an unfinished
character and emits it whole once its last byte arrives. Work per token is proportional to the token's length,
never to the answer's.

Guarantees, for a byte-level BPE tokenizer:
- every delta is a valid string of whole code points: no character is split across deltas, and no U+FFFD is ever
  made up: bytes the model produced that are not UTF-8 are left out (decode shows each as U+FFFD);
- "".join(deltas) == tokenizer.decode(ids) with its U+FFFD removed, leading spaces included (" Paris" stays
  " Paris"): an answer ending inside a character loses that unfinished character (flush drops it) too;
- special tokens (eos, end of turn) contribute "".

Grapheme clusters may span deltas: a ZWJ family emoji, a skin-tone modifier or a combining accent can arrive one
code point at a time. Each delta is still valid text, and the browser joins them when it appends the Text nodes.
"""

from __future__ import annotations

import codecs

from .tokenizer import Tokenizer


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer):
        self._token_bytes = tokenizer.token_bytes
        # errors="ignore": bytes that can never form a character are left out, where decode's lossy UTF-8 shows
        # U+FFFD; a student should not see the model's byte-level slips as boxes.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")

    def push(self, token_id: int) -> str:
        """The text that token `token_id` completes; "" while a character is unfinished or for a special token."""
        return self._utf8.decode(self._token_bytes(token_id))

    def flush(self) -> int:
        """End of the answer: drops what is still held (only ever the start of an unfinished character, which
        could only be shown as U+FFFD) and returns how many bytes that was."""
        held, _ = self._utf8.getstate()
        self._utf8.reset()
        return len(held)
