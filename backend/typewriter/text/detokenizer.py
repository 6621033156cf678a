"""Token ids -> text, one token at a time, sending only text that can never be taken back.

Byte-level BPE tokens are byte strings, and one character may be spread over several tokens (an emoji is often
three or four). Each token's bytes go through an incremental UTF-8 decoder, which holds back an unfinished
character and emits it whole once its last byte arrives. Work per token is proportional to the token's length,
never to the answer's.

SentencePiece-style tokenizers (Llama-2, TinyLlama, Mistral, Phi-3) spell a space "▁" and a character missing
from the vocab as byte tokens `<0xE4><0xBD><0xA0>`; the tokenizer gives each token's bytes the same way, so the
same decoder assembles them. Their decode also drops the answer's first leading space ("▁Paris" alone is
"Paris"), and so does the stream, on the first text it sends.

Guarantees, for every tokenizer kind `Tokenizer` loads:
- every delta is a valid string of whole code points: no character is split across deltas, and no U+FFFD is ever
  made up: bytes the model produced that are not UTF-8 are left out (decode shows each as U+FFFD);
- "".join(deltas) == tokenizer.decode(ids) with its U+FFFD removed, leading spaces as decode has them (byte-level
  " Paris" stays " Paris"): an answer ending inside a character loses that unfinished character (flush drops it)
  too. One difference: where a run of byte tokens is not UTF-8 as a whole, SentencePiece's decode shows every
  byte of the run as U+FFFD, and the stream keeps the whole characters inside the run;
- special tokens (eos, end of turn) contribute "".

Grapheme clusters may span deltas: a ZWJ family emoji, a skin-tone modifier or a combining accent can arrive one
code point at a time. Each delta is still valid text, and the browser joins them when it appends the Text nodes.
"""

from __future__ import annotations

import codecs
from typing import Protocol

from .token_text import LeadingSpace, TokenText


class Spelling(Protocol):
    """What the detokenizer reads of a tokenizer (tokenizer.py's, or a test's)."""

    token_text: TokenText
    special_ids: frozenset[int]


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Spelling):
        text = tokenizer.token_text
        self._table = text.table
        self._first_table = text.first_table or text.table  # only FIRST_TOKEN's spelling has a first table
        self._special_ids = tokenizer.special_ids
        # errors="ignore": bytes that can never form a character are left out, where decode's lossy UTF-8 shows
        # U+FFFD; a student should not see the model's byte-level slips as boxes.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        # Until the start of the answer is settled, push goes through `_start`; then it is one table look-up.
        self._start = {LeadingSpace.KEEP: None, LeadingSpace.STRIP_ONE: self._strip_one,
                       LeadingSpace.FIRST_TOKEN: self._first_token}[text.leading_space]

    def push(self, token_id: int) -> str:
        """The text that token `token_id` completes; "" while a character is unfinished or for a special token."""
        if self._start is not None:
            return self._start(token_id)
        return self._utf8.decode(self._table[token_id])

    def _strip_one(self, token_id: int) -> str:
        """decode's Strip: one space at the start of the whole text goes, whichever token brought it."""
        text = self._utf8.decode(self._table[token_id])
        if text:
            self._start = None
            return text[1:] if text[0] == " " else text
        return text

    def _first_token(self, token_id: int) -> str:
        """decode's Metaspace: the first token that is not special loses its "▁"s."""
        if token_id in self._special_ids:
            return ""
        self._start = None
        return self._utf8.decode(self._first_table[token_id])

    def flush(self) -> int:
        """End of the answer: drops what is still held (only ever the start of an unfinished character, which
        could only be shown as U+FFFD) and returns how many bytes that was."""
        held, _ = self._utf8.getstate()
        self._utf8.reset()
        return len(held)
