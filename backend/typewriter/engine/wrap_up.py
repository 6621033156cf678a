"""Steering a constrained answer that loops where its constraint cannot end to its end.

A small model under a JSON Schema often falls into a loop inside a string that never closes
("1234-1234-1234-...", "-de-la-mira-de-la-mira-"); cut at its length, the answer would not parse. Once the loop
guard sees such a loop, each next token is chosen among the likeliest ones the constraint allows (and the
closing quote and brackets, if it allows them) as the one that closes the most quotes and brackets, and of those
one the loop has not used, the model's own preference deciding the rest. The mask still applies, so the answer
that ends this way matches its constraint (docs/measurements/2026-12-05-real-world-schemas.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .repetition import MIN_TOKENS

CANDIDATES = 64  # the likeliest allowed tokens weighed at each step
RECENT = MIN_TOKENS  # the latest tokens, where the loop the guard saw is
_OUT, _IN, _ESCAPED = 0, 1, 2  # outside a string, inside one, just after a backslash inside one
_CLOSERS = (b'"', b"}", b"]")


def scan(data: bytes, state: int = _OUT) -> tuple[int, int]:
    """(the state after `data`, how many quotes and brackets it opened less those it closed), from `state`."""
    depth = 0
    for byte in data:
        if state == _ESCAPED:
            state = _IN
        elif state == _IN:
            if byte == 0x5C:  # backslash
                state = _ESCAPED
            elif byte == 0x22:
                state, depth = _OUT, depth - 1
        elif byte == 0x22:
            state, depth = _IN, depth + 1
        elif byte in b"{[":
            depth += 1
        elif byte in b"}]":
            depth -= 1
    return state, depth


class WrapUp:
    def __init__(self, table: Sequence[bytes], answer: bytes, recent: Sequence[int]):
        """`table`: each token's bytes; `answer`: the answer's bytes so far; `recent`: its latest token ids."""
        self.table = table
        self.state, _ = scan(answer)
        self.recent = list(recent[-RECENT:])
        self.closers = [i for i in (_index(table, c) for c in _CLOSERS) if i is not None]

    def push(self, token_id: int) -> None:
        self.state, _ = scan(self.table[token_id], self.state)
        self.recent = [*self.recent[1 - RECENT:], token_id]

    def steer(self, logits: np.ndarray) -> np.ndarray:
        """`logits` (masked: -inf where the constraint forbids) with all but the chosen candidates at -inf."""
        allowed = np.flatnonzero(np.isfinite(logits))
        if allowed.size == 0:
            return logits
        k = min(CANDIDATES, allowed.size)
        top = allowed[np.argpartition(-logits[allowed], k - 1)[:k]]
        candidates = {int(i) for i in top} | {i for i in self.closers if np.isfinite(logits[i])}
        depth = {i: scan(self.table[i], self.state)[1] for i in candidates}
        least = min(depth.values())
        chosen = [i for i in candidates if depth[i] == least]
        fresh = [i for i in chosen if i not in self.recent]
        out = np.full_like(logits, -np.inf)
        keep = fresh or chosen
        out[keep] = logits[keep]
        return out


def _index(table: Sequence[bytes], piece: bytes) -> int | None:
    try:
        return table.index(piece)
    except ValueError:
        return None
