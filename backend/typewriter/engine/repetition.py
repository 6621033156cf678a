"""An answer that has started to repeat itself ends, with reason `repetition`, instead of looping to its length.

A small model sometimes falls into a loop: the same line, or the same few words, over and over until the length
runs out, a screenful of noise for the student and slots held for nothing. The guard watches the answer's token
ids: for every period p up to MAX_PERIOD it counts how many of the latest tokens equal the token p before them,
so a count of k means the last k + p tokens are one unit of p tokens repeated. The answer ends once some unit is
repeated REPEATS more times after its first copy and the repetition spans MIN_TOKENS tokens: short or few
repeats (a list's markers, a word said twice, a table's rule) never trip it. A client that wants repetition
(a tongue twister, a line of code copied ten times) turns it off (`loop_guard: false`).
"""

from __future__ import annotations

import numpy as np

MAX_PERIOD = 128  # tokens: a repeated sentence or line of a small model fits
REPEATS = 4  # copies after the first
MIN_TOKENS = 64  # tokens of repetition after the first copy, whatever the period


class LoopGuard:
    def __init__(self) -> None:
        self._recent = np.full(MAX_PERIOD, -1, np.int64)  # the last MAX_PERIOD ids, newest first
        self._runs = np.zeros(MAX_PERIOD, np.int64)  # runs[p - 1]: latest tokens equal to the one p before
        self._needed = np.maximum(MIN_TOKENS, REPEATS * np.arange(1, MAX_PERIOD + 1))

    def push(self, token_id: int) -> bool:
        """Take the answer's next token; True once the answer is looping."""
        same = self._recent == token_id  # same[p - 1]: this token equals the one p before it
        self._runs = (self._runs + 1) * same
        self._recent = np.roll(self._recent, 1)
        self._recent[0] = token_id
        return bool((self._runs >= self._needed).any())
