"""An answer that repeats itself ends with reason `repetition` instead of looping to its length; short or few
repeats (a list's markers, a word said twice) never trip the guard, and a client that wants repetition turns it off.
"""

from __future__ import annotations

import numpy as np

MAX_PERIOD = 128  # tokens: a small model's repeated line fits
REPEATS = 4  # copies after the first
MIN_TOKENS = 64  # tokens of repetition after the first copy, whatever the period


class LoopGuard:
    def __init__(self) -> None:
        self._recent = np.full(MAX_PERIOD, -1, np.int64)  # the last MAX_PERIOD ids, newest first
        self._runs = np.zeros(MAX_PERIOD, np.int64)  # runs[p - 1]: latest tokens equal to the one p before
        self._needed = np.maximum(MIN_TOKENS, REPEATS * np.arange(1, MAX_PERIOD + 1))

    def push(self, token_id: int) -> bool:
        """Take the answer's next token; True once the answer is looping."""
        same = self._recent == token_id
        self._runs = (self._runs + 1) * same
        self._recent = np.roll(self._recent, 1)
        self._recent[0] = token_id
        return bool((self._runs >= self._needed).any())
