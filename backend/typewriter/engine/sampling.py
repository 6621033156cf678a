"""Choose the next token from one row of logits: repetition penalty, then greedy argmax or temperature, top-k, top-p
and a seeded draw. The penalty applies to greedy decoding too, as in Hugging Face's and llama.cpp's samplers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .request import SamplingParams

_TOP_P_FIRST_GUESS = 64  # candidates sorted first for top-p; grown 8x until they hold top_p of the mass


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)  # seed None: fresh OS entropy

    def skip(self, tokens: int) -> None:
        """Advance past `tokens` sampled elsewhere, so a seeded continuation draws what an uninterrupted run would."""
        self.rng.random(tokens)

    def sample(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """`logits`: one row [vocab]; `history`: the ids the penalty applies to."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float64).reshape(-1)  # a copy: the caller's row is not touched
        if p.repetition_penalty != 1.0 and len(history):
            logits = _penalise(logits, history, p.repetition_penalty)
        if p.greedy:
            return int(np.argmax(logits))  # the first maximum: ties go to the lowest id

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


def _penalise(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """CTRL-style: each distinct id already seen has a positive logit divided by `penalty`, a negative multiplied."""
    seen = np.unique(np.asarray(history, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < logits.size)]
    values = logits[seen]
    logits[seen] = np.where(values > 0, values / penalty, values * penalty)
    return logits


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
