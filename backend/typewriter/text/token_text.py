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
        punctuation, symbols: a number and its arithmetic), True for the rest, a piece of a character included.
        Worked out over the joined table, not token by token: one call a token was a tenth of a second of a start on
        a 150k vocabulary (docs/measurements/2026-12-06-start-off-the-gil.md)."""
        table = self.table
        lengths = np.fromiter(map(len, table), np.int64, len(table))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        data = np.frombuffer(b"".join(table), np.uint8)
        folded = data | 0x20
        wordy = _sums((folded >= ord("a")) & (folded <= ord("z")), starts, ends) > 0
        # the rest with a byte past ASCII: decoded together, "a" between them (none holds it); an undecodable byte
        # becomes a surrogate, which counts as a piece of a character
        rest = np.flatnonzero(~wordy & (_sums(data >= 0x80, starts, ends) > 0))
        if rest.size:
            text = b"a".join([table[i] for i in rest.tolist()]).decode("utf-8", "surrogateescape")
            points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
            distinct = np.flatnonzero(np.bincount(points))  # without sorting them
            letter = np.zeros(distinct[-1] + 1, bool)
            letter[distinct] = np.fromiter((chr(c).isalpha() or 0xDC80 <= c <= 0xDCFF for c in distinct.tolist()),
                                           bool, distinct.size)
            gaps = np.flatnonzero(points == ord("a"))
            per_char = letter[points]
            per_char[gaps] = False
            wordy[rest] = _sums(per_char, np.concatenate([[0], gaps + 1]), np.concatenate([gaps, [points.size]])) > 0
        return wordy


def _sums(flags: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of `flags[start:end]` are set, for each pair (empty ranges included)."""
    counts: np.ndarray = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
    sums: np.ndarray = counts[ends] - counts[starts]
    return sums
