"""Log probabilities (engine/logprobs.py) are of the distribution the sampler draws from: the same penalty,
temperature, top-k and top-p, so drawing many times from one row lands on each token as often as its probability
says."""

from __future__ import annotations

import numpy as np
import pytest

from typewriter.engine.logprobs import distribution, token_logprobs
from typewriter.engine.request import SamplingParams
from typewriter.engine.sampling import Sampler, Seen

DRAWS = 20_000


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=6, top_p=1.0, repetition_penalty=1.3, seed=1),
    SamplingParams(temperature=1.2, top_k=0, top_p=0.8, repetition_penalty=1.0, seed=2),
])
def test_the_sampler_draws_each_token_as_often_as_its_logprob_says(params):
    logits = np.random.default_rng(0).standard_normal(40) * 2
    logits[[3, 9]] = -np.inf  # masked by a constraint
    history = Seen([1, 2, 5])
    ids, logp = distribution(params, logits, history)
    sampler = Sampler(params)
    drawn = np.bincount([sampler.sample(logits, history) for _ in range(DRAWS)], minlength=40) / DRAWS
    expected = np.zeros(40)
    expected[ids] = np.exp(logp)
    assert np.isclose(expected.sum(), 1.0)
    assert np.abs(drawn - expected).max() < 0.015
    assert drawn[[3, 9]].sum() == 0 and expected[[3, 9]].sum() == 0


def test_the_listed_alternatives_are_the_likeliest_and_include_the_drawn_token_when_it_is_one():
    params = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, repetition_penalty=1.0)
    logits = np.array([0.0, 3.0, 1.0, 2.0, -1.0])
    out = token_logprobs(params, logits, Seen(), 3, 2)
    assert [i for i, _ in out.top] == [1, 3]
    assert np.isclose(out.logprob, dict(out.top)[3])
    greedy = token_logprobs(SamplingParams(temperature=0.0, repetition_penalty=1.0), logits, Seen(), 1, 5)
    assert np.isclose(sum(np.exp(p) for _, p in greedy.top), 1.0)  # temperature 1 over the whole row
