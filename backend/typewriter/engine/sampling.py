"""Choose the next token from one row of logits: repetition penalty, then greedy argmax or temperature, top-k, top-p
and a seeded draw. The penalty applies to greedy decoding too, as in Hugging Face's and llama.cpp's samplers.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .request import SamplingParams

_TOP_P_FIRST_GUESS = 64  # candidates sorted first for top-p; grown 8x until they hold top_p of the mass


class Seen:
    """The distinct ids a repetition penalty weighs, ascending, kept as the answer grows: a token already seen costs a
    set look-up, where making the whole history unique again cost every token of every row
    (docs/measurements/2026-12-06-per-token-python.md). Negative ids are never seen; ids past a row's end are left out
    where the row is penalised."""

    def __init__(self, ids: Iterable[int] = ()):
        self._known: set[int] = set()
        self._ids = np.empty(16, np.int64)
        self._count = 0
        for token_id in ids:
            self.add(token_id)

    def add(self, token_id: int) -> None:
        if token_id < 0 or token_id in self._known:
            return
        self._known.add(token_id)
        if self._count == self._ids.size:
            self._ids = np.concatenate([self._ids, np.empty(self._ids.size, np.int64)])
        at = int(np.searchsorted(self._ids[: self._count], token_id))
        self._ids[at + 1 : self._count + 1] = self._ids[at : self._count].copy()
        self._ids[at] = token_id
        self._count += 1

    @property
    def ids(self) -> np.ndarray:
        """[distinct] int64, ascending: a view, valid until the next `add`."""
        return self._ids[: self._count]

    def __contains__(self, token_id: object) -> bool:
        return token_id in self._known

    def __len__(self) -> int:
        return self._count


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)  # seed None: fresh OS entropy

    def skip(self, tokens: int) -> None:
        """Advance past `tokens` sampled elsewhere, so a seeded continuation draws what an uninterrupted run would."""
        self.rng.random(tokens)

    def sample(self, logits: np.ndarray, seen: Seen) -> int:
        """`logits`: one row [vocab]; `seen`: the ids the penalty applies to."""
        p = self.params
        penalised = p.repetition_penalty != 1.0 and len(seen) > 0
        if p.greedy:
            return _greedy(np.asarray(logits).reshape(-1), seen if penalised else None, p.repetition_penalty)
        logits = np.array(logits, dtype=np.float64).reshape(-1)  # a copy: the caller's row is not touched
        if penalised:
            logits = _penalise(logits, seen, p.repetition_penalty)

        ids = np.arange(logits.size)
        scores = logits / p.temperature
        if 0 < p.top_k < scores.size:
            ids = np.argpartition(-scores, p.top_k - 1)[: p.top_k]  # [top_k], unordered
            scores = scores[ids]
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            ids, probs = _nucleus(ids, probs, p.top_p)
        cumulative = np.cumsum(probs)
        choice = np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right")
        return int(ids[min(choice, ids.size - 1)])


def _penalise(logits: np.ndarray, seen: Seen, penalty: float) -> np.ndarray:
    """CTRL-style: each distinct id already seen has a positive logit divided by `penalty`, a negative multiplied.
    `logits` float64, changed in place."""
    ids = _within(seen, logits.size)
    logits[ids] = _penalised(logits[ids], penalty)
    return logits


def _within(seen: Seen, size: int) -> np.ndarray:
    ids = seen.ids
    return ids if not ids.size or ids[-1] < size else ids[ids < size]


def _penalised(values: np.ndarray, penalty: float) -> np.ndarray:
    values = values.astype(np.float64)
    return np.where(values > 0, values / penalty, values * penalty)


def _greedy(row: np.ndarray, seen: Seen | None, penalty: float) -> int:
    """The first maximum of the row, the seen ids penalised, as `argmax` of the penalised float64 copy would find it,
    without that copy of the whole row (docs/measurements/2026-12-06-per-token-python.md): the best id not seen
    against the best seen one, a tie to the lower id. A row with NaN takes the copy's way. The row is left as it came,
    though a writeable one is masked in place for a moment."""
    best = int(np.argmax(row))  # the first maximum: ties go to the lowest id
    if seen is None:
        return best
    best_seen = best in seen
    if penalty >= 1.0 and not best_seen:  # a penalty of 1 or more only lowers the seen ids: none passes it
        return best
    ids = _within(seen, row.size)
    if not ids.size:
        return best
    raw = row[ids]
    if best_seen:  # the best id not seen: the row without the seen ones, put back as it was before returning
        others = row if row.flags.writeable else row.copy()
        others[ids] = -np.inf
        try:
            best = int(np.argmax(others))
        finally:
            others[ids] = raw
    values = _penalised(raw, penalty)
    at = int(np.argmax(values))  # ids ascend: ties go to the lower id
    rival, other = float(values[at]), float(row[best])
    if rival != rival or other != other:  # NaN: as the copy's argmax finds it
        return int(np.argmax(_penalise(np.array(row, dtype=np.float64), seen, penalty)))
    if best in seen:  # every id seen (the row without them all -inf): the penalised ones alone
        return int(ids[at])
    return int(ids[at]) if rival > other or (rival == other and ids[at] < best) else best


def _nucleus(ids: np.ndarray, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The most probable tokens whose mass first reaches `top_p` (at least one), most probable first."""
    k = min(_TOP_P_FIRST_GUESS, probs.size)
    while True:
        head = np.argpartition(-probs, k - 1)[:k] if k < probs.size else np.arange(probs.size)
        head = head[np.lexsort((ids[head], -probs[head]))]  # by probability; among candidates, ties go to the lower id
        cumulative = np.cumsum(probs[head])
        if cumulative[-1] >= top_p or k == probs.size:
            break
        k = min(k * 8, probs.size)
    keep = min(int(np.searchsorted(cumulative, top_p, side="left")) + 1, k)
    head = head[:keep]
    return ids[head], probs[head]
