"""Token ids -> text, one token at a time, sending only text that can never be taken back: a character spread over
tokens goes out whole. "".join(deltas) is the tokenizer's decode less its U+FFFD (where SentencePiece shows a whole
invalid byte run as U+FFFD, the stream keeps its whole characters). Grapheme clusters may span deltas.
"""

from __future__ import annotations

import codecs
from typing import Protocol

from .token_text import LeadingSpace, TokenText


class Spelling(Protocol):
    token_text: TokenText
    special_ids: frozenset[int]


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Spelling):
        text = tokenizer.token_text
        self._table = text.table
        self._first_table = text.first_table or text.table
        self._special_ids = tokenizer.special_ids
        # A student should not see the model's byte-level slips as boxes (U+FFFD).
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
        """Drops the start of an unfinished character, if any; how many bytes that was."""
        held, _ = self._utf8.getstate()
        self._utf8.reset()
        return len(held)
