"""A conversation that outgrows the context keeps going: whole exchanges are dropped from the front (a system message
and the latest question stay) until the answer fits with a quarter of the context to spare, so the next turns keep
the same history and its cached prefix. The cut is searched, counting messages newest first, so the work is bounded
by the context, not the frame (docs/measurements/2026-12-04-security-probe-fixes.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InvalidRequest, PromptTooLong

Message = dict[str, str]
Count = Callable[[str, int], int]  # a text's tokens, or any number above the limit once past it
MIN_FITTED_ANSWER = 64  # less room than this left for an answer is prompt_too_long, not a stub answer


def append_system(ours: str, theirs: str) -> str:
    """A client's system message after the server's system prompt, which stays first."""
    return f"{ours}\n\n{theirs}" if ours and theirs else ours or theirs


def check_question(content: str, field: str) -> None:
    """A blank question is refused, as a small model given nothing to answer writes loops; earlier ones may be blank."""
    if not content.strip():
        raise InvalidRequest(field, "must not be empty or only whitespace: there is nothing to answer")


@dataclass(frozen=True)
class FittedPrompt:
    prompt_ids: list[int]
    max_new_tokens: int
    dropped_messages: int


def fit_conversation(messages: Sequence[Message], encode: Callable[[list[Message]], list[int]], context: int,
                     default: int, asked: int | None = None, count: Count | None = None) -> FittedPrompt:
    """PromptTooLong when even the last message, the question, leaves too little room. Without `count` every
    candidate cut is a whole encode."""
    head = list(messages[:1]) if messages and messages[0]["role"] == "system" else []
    rest = list(messages[len(head):])
    want = asked if asked is not None else min(default, context // 2)  # a default never takes all the history
    cuts = _cuts(len(rest))
    floor = _lower_bounds(head, rest, cuts, count, context) if count else [0] * len(cuts)
    encoded: dict[int, list[int]] = {}

    def prompt(i: int) -> list[int]:
        if i not in encoded:
            encoded[i] = encode(head + rest[cuts[i]:])
        return encoded[i]

    last, chosen = len(cuts) - 1, 0
    if floor[0] + want > context or len(prompt(0)) + want > context:
        target = context - context // 4
        start = next((i for i in range(1, last) if floor[i] + want <= target), last)  # none before can fit
        found = _first(range(start, last), lambda i: len(prompt(i)) + want <= target)
        chosen = last if found is None else found
    if chosen == last and floor[last] > context:  # refused without encoding the question
        need = asked if asked is not None else min(default, MIN_FITTED_ANSWER)
        raise PromptTooLong(floor[last], need, context, asked=asked is not None, at_least=True)
    ids = prompt(chosen)
    return FittedPrompt(ids, fit_max_new_tokens(len(ids), context, default, asked), cuts[chosen])


def kept_messages(messages: Sequence[Message], dropped: int) -> list[Message]:
    """The messages a FittedPrompt holds: a system message, then all but the `dropped` oldest of the rest."""
    head = list(messages[:1]) if messages and messages[0]["role"] == "system" else []
    return head + list(messages[len(head) + dropped:])


def _cuts(n: int) -> list[int]:
    """Messages dropped per candidate: none, then an exchange at a time so roles alternate, last all but one."""
    cuts = list(range(0, n - 1, 2))
    return cuts + [n - 1] if cuts[-1:] != [n - 1] else cuts


def _lower_bounds(head: list[Message], rest: list[Message], cuts: list[int], count: Count,
                  context: int) -> list[int]:
    """Per cut, its messages' tokens before the template, counted newest first and no further than `context`."""
    budget = context + 1
    total = count(head[0]["content"], budget) if head else 0
    sizes: list[int] = []  # of rest, newest first
    for message in reversed(rest):
        if total > context:
            break
        total += count(message["content"], budget - total)
        sizes.append(total)
    bounds = []
    for cut in cuts:
        kept = len(rest) - cut  # sizes[kept - 1] is their total, if it was counted
        bounds.append(sizes[kept - 1] if kept <= len(sizes) else context + 1)
    return bounds


def _first(candidates: range, fits: Callable[[int], bool]) -> int | None:
    """The first candidate that fits, `fits` monotone: galloping, then halving, so a near cut costs few calls."""
    if not candidates:
        return None
    lo, step, hi = candidates.start, 1, None
    while hi is None:
        probe = lo + step - 1
        if probe >= candidates.stop - 1:
            if not fits(candidates.stop - 1):
                return None
            hi = candidates.stop - 1
        elif fits(probe):
            hi = probe
        else:
            lo, step = probe + 1, step * 2
    while lo < hi:  # fits(hi); everything before lo does not
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def fit_max_new_tokens(prompt_tokens: int, context: int, default: int, asked: int | None = None) -> int:
    """An asked length is kept (the engine refuses it if it does not fit); the default shrinks to the room left,
    never below MIN_FITTED_ANSWER."""
    if asked is not None:
        return asked
    room = context - prompt_tokens
    if room >= default:
        return default
    if room >= MIN_FITTED_ANSWER:
        return room
    raise PromptTooLong(prompt_tokens, min(default, MIN_FITTED_ANSWER), context, asked=False)
