"""A conversation that outgrows the context keeps going: its oldest turns are left out of the prompt.

When the history leaves less room than the answer's length (asked for, or the default up to half the context),
whole exchanges are dropped from the front (a system message the client sent and the latest question always
stay) until the answer fits with a quarter of the context to spare, so the next few turns keep the same
shortened history and its cached prefix. Only a latest question that cannot fit on its own is prompt_too_long.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine.request import fit_max_new_tokens
from ..errors import InvalidRequest

Message = dict[str, str]


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
                     default: int, asked: int | None = None) -> FittedPrompt:
    """The prompt for `messages` (the last is the user's question) and the answer length it gets; raises
    PromptTooLong when even the question alone leaves too little room."""
    head = [m for m in messages[:1] if m["role"] == "system"]
    rest = list(messages[len(head):])
    want = asked if asked is not None else min(default, context // 2)  # a default never takes all the history
    prompt = encode(head + rest)
    dropped = 0
    if len(prompt) + want > context and len(rest) > 1:
        target = context - context // 4
        while len(rest) > 1 and len(prompt) + want > target:
            cut = 2 if len(rest) > 2 else 1  # an exchange at a time, so roles keep alternating
            rest, dropped = rest[cut:], dropped + cut
            prompt = encode(head + rest)
    return FittedPrompt(prompt, fit_max_new_tokens(len(prompt), context, default, asked), dropped)
