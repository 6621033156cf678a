"""What each slot's K/V cache holds, so a new request can start from the longest prefix already computed.

A slot keeps the token ids whose K/V it holds after its request ends (the prompt and the answer as generated,
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

What a slot holds belongs to the owner of the request that computed it (a socket, a conversation key: the
server decides). A request reuses its own owner's tokens as far as they match, and another owner's only as its
`shared` prefix, all of it or nothing: the tokens every request of the server begins with (its system prompt).
How many tokens a request finds cached, and so how soon its first token comes, then never depends on another
owner's text: guessing a classmate's "My student ID is 7138..." finds the same `shared` tokens right or wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

MIN_COPY = 16  # a shorter shared prefix is cheaper to recompute than to copy a whole slot's cache


@dataclass(frozen=True)
class Held:
    """What a busy slot holds: the ids whose K/V are in it, and whose they are."""

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


def usable(prompt: Sequence[int], held: Sequence[int], same_owner: bool, shared: int) -> int:
    """How many leading tokens of `prompt` a slot holding `held` gives: all that match for the same owner; for
    another owner `shared` if `held` begins with the prompt's first `shared` tokens, else none, so the answer
    says nothing about `held` past what every request shares."""
    matched = common_prefix(prompt, held)
    if same_owner:
        return matched
    return shared if matched >= shared else 0


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
        self._owners: list[str | None] = [None] * slots  # whose they are
        self._used = [0] * slots  # when each slot was last released, for least-recently-used order
        self._clock = 0

    def release(self, slot: int, tokens: list[int], owner: str | None = None) -> None:
        """The request in `slot` has ended; its cache holds K/V for `tokens`, computed for `owner`."""
        self._clock += 1
        self._tokens[slot], self._owners[slot], self._used[slot] = tokens, owner, self._clock

    def place(self, prompt: Sequence[int], free: Sequence[int], busy: Callable[[int], Held],
              busy_slots: Sequence[int], reuse: bool = True, piece: Callable[[int], bytes] | None = None,
              room: int = 0, owner: str | None = None, shared: int = 0) -> Placement:
        """Where `owner`'s prompt starts: a free slot and how many of its tokens are reused (none unless `reuse`).
        A prompt that continues one of its owner's conversations goes to that slot; any other takes the least
        recently used free slot, so it pushes out the conversation least likely to come back. A longer prefix
        held elsewhere (a busy slot; the shared prefix in another free slot) is copied in when that saves at least
        MIN_COPY tokens. `busy(slot)` gives what a busy slot holds; another owner's tokens give the first `shared`
        prompt tokens or none (`usable`). At least one prompt token is always left to compute (it yields the
        first logits). With `piece` (see `realign`), a prompt may be rewritten to its owner's free slot's tokens of
        the same text, at most `room` tokens longer."""
        target = min(free, key=lambda s: self._used[s])
        if not reuse:
            self._tokens[target] = []
            return Placement(target, 0)
        limit = len(prompt) - 1
        own = {s: common_prefix(prompt, self._tokens[s]) for s in free if self._owners[s] == owner}
        slot = max(own, key=lambda s: (own[s], -self._used[s]), default=None)
        if slot is None or own[slot] < max(shared, 1):  # no conversation of its own to go on with
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

    def _usable(self, prompt: Sequence[int], slot: int, owner: str | None, shared: int) -> int:
        return usable(prompt, self._tokens[slot], self._owners[slot] == owner, shared)

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
