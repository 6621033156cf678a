"""What each slot's K/V cache holds, so a new request can start from the longest prefix already computed.

A slot keeps the token ids whose K/V it holds after its sequence ends (the prompt and the answer as generated,
also one that was stopped), until the slot is given to another request; free slots are given out least
recently used first. A newcomer is placed where the longest prefix of its prompt is cached: in that slot if it
is free, or in another free slot after copying the cache over when the prefix lives in a busy slot (the tutor's
system prompt, shared by every student). Pure Python, no tensors.

Tokens match exactly, with one exception: the text of an answer the client sends back need not encode to the
tokens that were generated (greedy decoding may spell a word in two tokens that encoding writes as one). Given
each token's bytes (`piece`), a prompt that agrees with a free slot's cache as text past the point where their
tokens part is rewritten to the cached tokens up to the furthest point where both agree at a token boundary: the
same text, so the next turn reuses its whole history (a class of 4, traced: a third turn found 346 of its 569
prompt tokens cached, the 47th answer token spelt otherwise).
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
    prompt: list[int] | None = None  # the prompt rewritten to the cached tokens of the same text, if it was


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def realign(prompt: Sequence[int], cached: Sequence[int], start: int,
            piece: Callable[[int], bytes]) -> tuple[int, int] | None:
    """Where `prompt` and `cached`, equal in their first `start` ids, last agree as text at a boundary of both:
    (j, k) with the bytes of cached[:j] those of prompt[:k], j > start furthest; None if they part at once.
    `piece(id)`: a token's bytes, a special token's its own (never equal to text)."""
    i = k = start
    ahead_c = ahead_p = b""  # bytes one side has read past the other's
    best = None
    while True:
        if not ahead_c and not ahead_p and i > start:
            best = (i, k)
        if len(ahead_c) <= len(ahead_p):
            if i == len(cached):
                return best
            ahead_c += piece(cached[i])
            i += 1
        else:
            if k == len(prompt):
                return best
            ahead_p += piece(prompt[k])
            k += 1
        n = min(len(ahead_c), len(ahead_p))
        if ahead_c[:n] != ahead_p[:n]:
            return best
        ahead_c, ahead_p = ahead_c[n:], ahead_p[n:]


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
              busy_slots: Sequence[int], reuse: bool = True, piece: Callable[[int], bytes] | None = None,
              room: int = 0) -> Placement:
        """Where a prompt starts: a free slot and how many of its tokens are reused (none unless `reuse`: then the
        least recently used slot). `busy(slot)` gives the ids a busy slot holds. At least one prompt token is
        always left to compute (it yields the first logits). With `piece` (see `realign`), a prompt may be
        rewritten to a free slot's tokens of the same text, at most `room` tokens longer."""
        if not reuse:
            target = min(free, key=lambda s: self._used[s])
            self._tokens[target] = []
            return Placement(target, 0)
        limit = len(prompt) - 1
        matched = {slot: common_prefix(prompt, self._tokens[slot]) for slot in free}
        best_free = max(free, key=lambda s: (matched[s], -self._used[s]))
        reused = min(limit, matched[best_free])
        rewritten = self._realigned(prompt, matched, piece, room) if piece else None
        if rewritten and min(len(rewritten[1]) - 1, rewritten[2]) > reused:
            best_free, prompt, cached = rewritten
            limit = len(prompt) - 1
            reused = min(limit, cached)
        else:
            rewritten = None
        # Another free slot never holds a longer prefix than best_free; a busy one may.
        shared, donor = max(((min(limit, common_prefix(prompt, busy(s))), s) for s in busy_slots), default=(0, -1))
        if shared >= reused + MIN_COPY:
            target = min(free, key=lambda s: self._used[s])  # keep the recently used conversations
            self._tokens[target] = []
            return Placement(target, shared, copy_from=donor, prompt=list(prompt) if rewritten else None)
        self._tokens[best_free] = []
        return Placement(best_free, reused, prompt=list(prompt) if rewritten else None)

    def _realigned(self, prompt: Sequence[int], matched: dict[int, int], piece: Callable[[int], bytes],
                   room: int) -> tuple[int, list[int], int] | None:
        """(slot, the prompt rewritten, tokens reused) for the free slot whose cache agrees with the prompt as
        text the furthest past where their tokens part (`matched`: each free slot's ids in common with the
        prompt); None where none does."""
        best = None
        for slot, start in matched.items():
            cached = self._tokens[slot]
            if start == len(cached) or start == len(prompt):
                continue  # nothing cached past the tokens that match, or the whole prompt matches
            found = realign(prompt, cached, start, piece)
            if found and len(prompt) - found[1] + found[0] <= len(prompt) + room and (best is None or
                                                                                      found[0] > best[2]):
                j, k = found
                best = (slot, [*cached[:j], *prompt[k:]], j)
        return best
