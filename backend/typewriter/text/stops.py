"""Stop sequences over streamed text: a tail that may begin a stop sequence is held back (at most the longest stop
less one character) until it completes the stop, and is dropped with all after it, or stops matching.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stop_sequences: Sequence[str]):
        if any(not s for s in stop_sequences):
            raise ValueError("stop sequences must be non-empty strings")
        self._stops = tuple(stop_sequences)
        self._held = ""
        self.stopped = False

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to send, whether a stop sequence has now been completed)."""
        if self.stopped:
            return "", True
        text = self._held + text
        found = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        if found:
            self._held, self.stopped = "", True
            return text[: min(found)], True
        hold = self._partial_stop_length(text)
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """Release held text when the answer ends for another reason (eos, length): it never became a stop."""
        text, self._held = self._held, ""
        return "" if self.stopped else text

    def _partial_stop_length(self, text: str) -> int:
        longest = max((len(s) for s in self._stops), default=1)
        for n in range(min(len(text), longest - 1), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0
