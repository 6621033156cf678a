"""How a tokenizer spells each token in bytes, so the engine streams text without importing transformers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np


class LeadingSpace(Enum):
    KEEP = "keep"  # byte-level BPE: " Paris" stays " Paris"
    STRIP_ONE = "strip_one"  # SentencePiece with a Strip decoder: one space at the start of the text is dropped
    FIRST_TOKEN = "first_token"  # the Metaspace decoder: the first token's "▁"s are dropped, not made spaces


@dataclass(frozen=True)
class TokenText:
    """`first_table`: the first non-special token's bytes where they differ (LeadingSpace.FIRST_TOKEN)."""

    table: list[bytes]
    leading_space: LeadingSpace
    first_table: list[bytes] | None = None

    @cached_property
    def wordy(self) -> np.ndarray:
        """[vocab] bool: False for a token of whole characters none of which is a letter (digits, spaces,
        punctuation, symbols: a number and its arithmetic), True for the rest, a piece of a character included."""
        return np.fromiter((_wordy(spelling) for spelling in self.table), bool, len(self.table))


def _wordy(spelling: bytes) -> bool:
    try:
        return any(c.isalpha() for c in spelling.decode("utf-8"))
    except UnicodeDecodeError:
        return True
