"""Log probabilities in the distribution the sampler drew from (sampling.py's steps on the same row), so a token it
could not draw is never listed; a greedy answer reports the penalised, masked row at temperature 1.
"""

from __future__ import annotations

import numpy as np

from .request import SamplingParams, TokenLogprobs
from .sampling import Seen, _nucleus, _penalise


def token_logprobs(params: SamplingParams, logits: np.ndarray, seen: Seen, token_id: int,
                   top: int) -> TokenLogprobs:
    """`logits`: the row [vocab] the token was drawn from, masked and not yet penalised."""
    ids, logp = distribution(params, logits, seen)
    order = np.lexsort((ids, -logp))  # likeliest first; ties to the lower id, as the sampler breaks them
    ids, logp = ids[order], logp[order]
    found = np.flatnonzero(ids == token_id)
    chosen = float(logp[found[0]]) if found.size else float("-inf")
    return TokenLogprobs(chosen, tuple((int(i), float(p)) for i, p in zip(ids[:top], logp[:top])))


def distribution(params: SamplingParams, logits: np.ndarray, seen: Seen) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(logits, dtype=np.float64).reshape(-1).copy()
    if params.repetition_penalty != 1.0 and len(seen):
        logits = _penalise(logits, seen, params.repetition_penalty)
    ids = np.flatnonzero(np.isfinite(logits))  # a masked token has no probability at all
    scores = logits[ids] / (params.temperature if not params.greedy else 1.0)
    if not params.greedy and 0 < params.top_k < scores.size:
        keep = np.argpartition(-scores, params.top_k - 1)[: params.top_k]
        ids, scores = ids[keep], scores[keep]
    probs = np.exp(scores - scores.max())
    probs /= probs.sum()
    if not params.greedy and params.top_p < 1.0:
        ids, probs = _nucleus(ids, probs, params.top_p)
        probs = probs / probs.sum()
    return ids, np.log(probs)
