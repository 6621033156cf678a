"""What each slot's K/V cache holds, so a new request can start from the longest prefix already computed.

A slot keeps the token ids whose K/V it holds after its sequence ends (the prompt and the answer as generated,
also one that was stopped), until the slot is given to another request; free slots are given out least
recently used first. A newcomer is placed where the longest prefix of its prompt is cached: in that slot if it
is free, or in another free slot after copying the cache over when the prefix lives in a busy slot (the tutor's
system prompt, shared by every student). Exact token match only. Pure Python, no tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_COPY = 16  # a shorter shared prefix is cheaper to recompute than to copy a whole slot's cache


@dataclass(frozen=True)
class Placement:
    slot: int
    reused: int  # prompt tokens whose K/V are already in the slot (after the copy, if any)
    copy_from: int | None = None  # slot whose cache is copied into `slot` first


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    def __init__(self, slots: int):
        self._tokens: list[list[int]] = [[] for _ in range(slots)]  # ids held by each free slot
        self._used = [0] * slots  # when each slot was last released, for least-recently-used order
        self._clock = 0

    def release(self, slot: int, tokens: list[int]) -> None:
        """The sequence in `slot` has ended; its cache holds K/V for `tokens`."""
        self._clock += 1
        self._tokens[slot], self._used[slot] = tokens, self._clock

    def place(self, prompt: Sequence[int], free: Sequence[int], busy: Callable[[int], Sequence[int]],
              busy_slots: Sequence[int], reuse: bool = True) -> Placement:
        """Where a prompt starts: a free slot and how many of its tokens are reused (none unless `reuse`: then the
        least recently used slot). `busy(slot)` gives the ids a busy slot holds. At least one prompt token is
        always left to compute (it yields the first logits)."""
        if not reuse:
            target = min(free, key=lambda s: self._used[s])
            self._tokens[target] = []
            return Placement(target, 0)
        limit = len(prompt) - 1
        best_free = max(free, key=lambda s: (common_prefix(prompt, self._tokens[s]), -self._used[s]))
        reused = min(limit, common_prefix(prompt, self._tokens[best_free]))
        # Another free slot never holds a longer prefix than best_free; a busy one may.
        shared, donor = max(((min(limit, common_prefix(prompt, busy(s))), s) for s in busy_slots), default=(0, -1))
        if shared >= reused + MIN_COPY:
            target = min(free, key=lambda s: self._used[s])  # keep the recently used conversations
            self._tokens[target] = []
            return Placement(target, shared, copy_from=donor)
        self._tokens[best_free] = []
        return Placement(best_free, reused)
