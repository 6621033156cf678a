"""What each slot's K/V cache holds, so a new request starts from the longest prefix already computed. Pure Python.
A request reuses another owner's tokens only as one of its whole `shared` prefixes (the class's prompt), so how soon
a first token comes never reveals another owner's text. A prompt that spells a cached answer in other tokens is rewritten
to the cached ones (`realign`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_COPY = 16  # a shorter shared prefix is cheaper to recompute than to copy a whole slot's cache


@dataclass(frozen=True)
class Held:
    tokens: Sequence[int]
    owner: str | None


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


def usable(prompt: Sequence[int], held: Sequence[int], same_owner: bool, shared: Sequence[int]) -> int:
    """For another owner, the longest of the `shared` lengths that both begin with, or nothing, so the answer says
    nothing about `held` past what everyone shares."""
    matched = common_prefix(prompt, held)
    if same_owner:
        return matched
    return max((n for n in shared if n <= matched), default=0)


def realign(prompt: Sequence[int], cached: Sequence[int], start: int,
            piece: Callable[[int], bytes]) -> tuple[int, int] | None:
    """The furthest (j, k), j > start, where the bytes of cached[:j] are those of prompt[:k]; None if the two part
    at once. They are equal in their first `start` ids."""
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
        self._owners: list[str | None] = [None] * slots
        self._used = [0] * slots  # release clock: least recently used first
        self._clock = 0

    def release(self, slot: int, tokens: list[int], owner: str | None = None) -> None:
        self._clock += 1
        self._tokens[slot], self._owners[slot], self._used[slot] = tokens, owner, self._clock

    def place(self, prompt: Sequence[int], free: Sequence[int], busy: Callable[[int], Held],
              busy_slots: Sequence[int], reuse: bool = True, piece: Callable[[int], bytes] | None = None,
              room: int = 0, owner: str | None = None, shared: Sequence[int] = ()) -> Placement:
        """A conversation goes on in its own slot, anything else pushes out the least recently used one; one prompt
        token is always left to compute, for the first logits. A prompt rewritten by `realign` grows at most `room`."""
        target = min(free, key=lambda s: self._used[s])
        if not reuse:
            self._tokens[target] = []
            return Placement(target, 0)
        limit = len(prompt) - 1
        own = {s: common_prefix(prompt, self._tokens[s]) for s in free if self._owners[s] == owner}
        slot = max(own, key=lambda s: (own[s], -self._used[s]), default=None)
        if slot is None or own[slot] < max((*shared, 1)):  # no conversation of its own to go on with
            slot = target
        reused = min(limit, self._usable(prompt, slot, owner, shared))
        rewritten = self._realigned(prompt, own, piece, room) if piece and own else None
        if rewritten and min(len(rewritten[1]) - 1, rewritten[2]) > reused:
            slot, prompt, cached = rewritten
            limit = len(prompt) - 1
            reused = min(limit, cached)
        else:
            rewritten = None
        held = {s: busy(s) for s in busy_slots}
        donors = [(min(limit, usable(prompt, h.tokens, h.owner == owner, shared)), s) for s, h in held.items()]
        donors += [(min(limit, self._usable(prompt, s, owner, shared)), s) for s in free if s != target]
        copied, donor = max(donors, default=(0, -1))
        if copied >= reused + MIN_COPY:
            self._tokens[target] = []  # the least recently used: keep the others' conversations
            return Placement(target, copied, copy_from=donor, prompt=list(prompt) if rewritten else None)
        self._tokens[slot] = []
        return Placement(slot, reused, prompt=list(prompt) if rewritten else None)

    def _usable(self, prompt: Sequence[int], slot: int, owner: str | None, shared: Sequence[int]) -> int:
        return usable(prompt, self._tokens[slot], self._owners[slot] == owner, shared)

    def _realigned(self, prompt: Sequence[int], matched: dict[int, int], piece: Callable[[int], bytes],
                   room: int) -> tuple[int, list[int], int] | None:
        """(slot, the prompt rewritten, tokens reused) for the free slot that agrees furthest as text."""
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
