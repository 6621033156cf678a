"""An answer that repeats itself ends with reason `repetition` instead of looping to its length; short or few
repeats (a list's markers, a word said twice) never trip the guard, and a client that wants repetition turns it off.
"""

from __future__ import annotations

MAX_PERIOD = 128  # tokens: a small model's repeated line fits
REPEATS = 4  # copies after the first
MIN_TOKENS = 64  # tokens of repetition after the first copy, whatever the period


class LoopGuard:
    """For each period p up to MAX_PERIOD, the run of latest tokens equal to the one p before; a token ends every run
    but those of the periods at which it was said before, so only those are kept (a few Python operations a token,
    where arrays of every period cost more than the rest of a token's text: docs/measurements/2026-12-06-per-token-python.md)."""

    def __init__(self) -> None:
        self._count = 0  # tokens pushed
        self._said: dict[int, list[int]] = {}  # id -> the indices it was pushed at, within the last MAX_PERIOD
        self._runs: dict[int, int] = {}  # period -> run, only the runs not ended

    def push(self, token_id: int) -> bool:
        """Take the answer's next token; True once the answer is looping."""
        now = self._count
        said = self._said.setdefault(token_id, [])
        while said and now - said[0] > MAX_PERIOD:
            del said[0]
        runs = {now - at: self._runs.get(now - at, 0) + 1 for at in said}
        self._runs = runs
        said.append(now)
        self._count = now + 1
        if now % MAX_PERIOD == 0:  # ids not said lately go, so the table stays the window's size
            self._said = {t: s for t, s in self._said.items() if now - s[-1] < MAX_PERIOD}
        return any(run >= max(MIN_TOKENS, REPEATS * period) for period, run in runs.items())
