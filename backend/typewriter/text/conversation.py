"""A conversation that outgrows the context keeps going: its oldest turns are left out of the prompt.

When the history leaves less room than the answer's length (asked for, or the default up to half the context),
whole exchanges are dropped from the front (a system message the client sent and the latest question always
stay) until the answer fits with a quarter of the context to spare, so the next few turns keep the same
shortened history and its cached prefix. Only a latest question that cannot fit on its own is prompt_too_long.

The work is bounded by the context, not by the frame: a frame of 127 long messages once cost seconds of CPU,
re-encoding the whole history for every exchange it dropped. Now the cut is searched: `count` (a text's tokens,
read only until a limit is passed) sizes the messages from the newest back and stops once they cannot all fit,
so older ones are never read; only conversations whose messages alone fit are then encoded whole, a few times
at most (a galloping search over the cut, which is monotone: a shorter history is a shorter prompt).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import InvalidRequest, PromptTooLong

Message = dict[str, str]
Count = Callable[[str, int], int]  # a text's tokens, or any number above the limit once past it
MIN_FITTED_ANSWER = 64  # less room than this left for an answer is prompt_too_long, not a stub answer


def check_question(content: str, field: str) -> None:
    """The question, the last user message, must have something in it: content that is empty or only whitespace
    (what str.isspace calls whitespace) is InvalidRequest naming `field`. Given nothing to answer, a small model
    writes hundreds of tokens of loops. Earlier messages of a conversation may be blank."""
    if not content.strip():
        raise InvalidRequest(field, "must not be empty or only whitespace: there is nothing to answer")


@dataclass(frozen=True)
class FittedPrompt:
    prompt_ids: list[int]
    max_new_tokens: int
    dropped_messages: int  # how many of the oldest messages were left out


def fit_conversation(messages: Sequence[Message], encode: Callable[[list[Message]], list[int]], context: int,
                     default: int, asked: int | None = None, count: Count | None = None) -> FittedPrompt:
    """The prompt for `messages` (the last is the user's question) and the answer length it gets; raises
    PromptTooLong when even the question alone leaves too little room. `count`, if given, sizes messages
    cheaply (see the module's docstring); without it every candidate is a whole encode."""
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
    if floor[0] + want > context or len(prompt(0)) + want > context:  # it does not fit whole
        target = context - context // 4
        start = next((i for i in range(1, last) if floor[i] + want <= target), last)  # none before can fit
        found = _first(range(start, last), lambda i: len(prompt(i)) + want <= target)
        chosen = last if found is None else found
    if chosen == last and floor[last] > context:  # the question alone passes the context: said without encoding it
        need = asked if asked is not None else min(default, MIN_FITTED_ANSWER)
        raise PromptTooLong(floor[last], need, context, asked=asked is not None, at_least=True)
    ids = prompt(chosen)
    return FittedPrompt(ids, fit_max_new_tokens(len(ids), context, default, asked), cuts[chosen])


def _cuts(n: int) -> list[int]:
    """How many of `n` messages are dropped at each step, in order: none, then an exchange at a time so roles
    keep alternating, and last everything but the question."""
    cuts = list(range(0, n - 1, 2))
    return cuts + [n - 1] if cuts[-1:] != [n - 1] else cuts


def _lower_bounds(head: list[Message], rest: list[Message], cuts: list[int], count: Count,
                  context: int) -> list[int]:
    """For each cut, the tokens its messages' texts alone come to (the template adds to them), counted from the
    newest message back and no further than `context`: a cut that needs an older message is past it too."""
    budget = context + 1
    total = count(head[0]["content"], budget) if head else 0
    sizes: list[int] = []  # of rest, newest first, while the total is within the budget
    for message in reversed(rest):
        if total > context:
            break
        total += count(message["content"], budget - total)
        sizes.append(total)
    bounds = []
    for cut in cuts:
        kept = len(rest) - cut  # messages kept: sizes[kept - 1] is their total, if it was counted
        bounds.append(sizes[kept - 1] if kept <= len(sizes) else context + 1)
    return bounds


def _first(candidates: range, fits: Callable[[int], bool]) -> int | None:
    """The first candidate that fits, `fits` being monotone (once true, true for every later one): galloping out
    from the first, then halving, so a cut near the start costs few calls and one far away log(n) calls."""
    if not candidates:
        return None
    lo, step, hi = candidates.start, 1, None  # everything before lo does not fit
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
    """How many new tokens a request may generate. A length the caller asked for is kept (if it does not fit, the
    engine refuses it with prompt_too_long); otherwise the default, shrunk to the room the context has left so a
    long conversation keeps working, but never below MIN_FITTED_ANSWER (or the default, if that is smaller)."""
    if asked is not None:
        return asked
    room = context - prompt_tokens
    if room >= default:
        return default
    if room >= MIN_FITTED_ANSWER:
        return room
    raise PromptTooLong(prompt_tokens, min(default, MIN_FITTED_ANSWER), context, asked=False)
