"""Drafts from the conversation (prompt lookup): where the last few tokens said already appeared earlier in the
prompt or the answer, the tokens that followed them then are guessed to follow again. A step checks a draft by
computing its positions as one chunk, which reads the weights once however many rows it has, so on one student
(a step bound by memory, not by arithmetic) each draft token taken is a token for a fraction of a step. Each row's
token is taken exactly as a decode step's would be, in order, and the first that differs from the draft ends it:
the answer is the one decoding alone gives, token for token, given a runner whose rows do not depend on the rows
beside them (`Runner.checks_drafts`). Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

LONGEST_MATCH = 4  # tokens of the answer's end looked up, longest first
SHORTEST_MATCH = 2  # a single token's last occurrence guessed too often wrong to pay its rows
# Steps a request goes without guessing after a guess of one token is refused, doubling while they are: an answer
# whose guesses never pay costs a row in this many steps at worst.
LONGEST_REST = 16


class Drafts:
    """One request's guesses: where each run of SHORTEST_MATCH..LONGEST_MATCH tokens last ended, and how long a
    guess has been paying: it grows by one each time it is taken whole and halves each time none of it is; a guess
    of one token refused makes it rest a step, then 2, 4, .. LONGEST_REST, until one is taken."""

    def __init__(self, most: int):
        self.most = most
        self.length = most
        self._follows: list[dict[tuple[int, ...], int]] = [{} for _ in range(LONGEST_MATCH + 1)]
        self._tokens: list[int] = []  # the prompt and the answer, as far as seen
        self._indexed = 0  # tokens whose runs are recorded
        self._rest = 0  # steps left without a guess
        self._next_rest = 1

    def propose(self, prompt: Sequence[int], answer: Sequence[int], room: int) -> list[int]:
        """At most min(self.length, room) tokens guessed to follow the prompt and then the answer so far (each
        only ever grows between calls)."""
        tokens = self._tokens
        if len(tokens) < len(prompt):
            tokens.extend(prompt[len(tokens):])
        tokens.extend(answer[len(tokens) - len(prompt):])
        self._index(tokens)
        if self._rest > 0:
            self._rest -= 1
            return []
        n, want = len(tokens), min(self.length, room)
        if want <= 0:
            return []
        for size in range(min(LONGEST_MATCH, n - 1), SHORTEST_MATCH - 1, -1):
            at = self._follows[size].get(tuple(tokens[n - size:]))
            if at is not None:
                return list(tokens[at:at + want])
        return []

    def checked(self, drafted: int, taken: int) -> None:
        """`taken` of a guess of `drafted` tokens were the answer's."""
        if taken == 0 and self.length == 1:
            self._rest, self._next_rest = self._next_rest, min(LONGEST_REST, 2 * self._next_rest)
        elif taken:
            self._next_rest = 1
        if taken == drafted:
            self.length = min(self.most, self.length + 1)
        elif taken == 0:
            self.length = max(1, self.length // 2)

    def _index(self, tokens: Sequence[int]) -> None:
        """Records each run ending before the last token with where its next token is, so a lookup of the
        answer's own end finds an earlier place, never itself."""
        for end in range(max(self._indexed, SHORTEST_MATCH), len(tokens)):
            for size in range(SHORTEST_MATCH, min(LONGEST_MATCH, end) + 1):
                self._follows[size][tuple(tokens[end - size:end])] = end
        self._indexed = max(self._indexed, len(tokens))
