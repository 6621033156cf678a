"""engine/step_cost.py on its own: the decode-only average, the chunk figures fit from noisy steps, forgetting, and the
longest chunk within an allowance. Pure Python, like the module."""

from __future__ import annotations

import random

import pytest

from typewriter.engine.step_cost import HEADROOM, INTER_TOKEN_S, SEEN, STALL, StepCost, attended


def test_attended_counts_each_tokens_cached_positions_its_own_included():
    assert attended(0, 1) == 1 and attended(0, 3) == 1 + 2 + 3 and attended(100, 2) == 101 + 102


def test_it_is_not_ready_before_a_decode_only_step_and_a_few_chunk_steps():
    costs = StepCost()
    costs.observe(1, [(0, 4)], 0.01)  # no decode-only step yet: nothing to measure a chunk against
    costs.observe(0, [(0, 64)], 0.05)  # nothing decoding: no one stalls, nothing learnt
    assert costs.seen == 0 and costs.decode_s(2) is None and not costs.ready
    costs.observe(2, [], 0.004)
    for n in range(1, SEEN + 1):
        assert not costs.ready
        costs.observe(2, [(0, n)], 0.004 + 0.001 * n)
    assert costs.ready and costs.allowance_s(2) == pytest.approx((STALL - 1) * 0.004)


def test_the_figures_of_a_noisy_machine_are_found_and_a_slower_machine_is_followed():
    rng = random.Random(3)
    costs = StepCost()

    def steps(per_token: float, per_position: float, n: int) -> None:
        for _ in range(n):
            costs.observe(1, [], 0.005 * rng.uniform(0.9, 1.1))
            start, length = rng.randrange(0, 1500), rng.randrange(1, 32)
            extra = per_token * length + per_position * attended(start, length)
            costs.observe(1, [(start, length)], 0.005 + extra * rng.uniform(0.9, 1.1))

    steps(0.001, 2e-6, 200)
    per_token, per_position = costs.figures()
    assert per_token == pytest.approx(0.001, rel=0.25) and per_position == pytest.approx(2e-6, rel=0.25)
    steps(0.003, 6e-6, 200)  # the machine got busy: three times slower
    per_token, per_position = costs.figures()
    assert per_token == pytest.approx(0.003, rel=0.25) and per_position == pytest.approx(6e-6, rel=0.25)


def test_a_figure_that_noise_makes_negative_is_dropped_and_the_other_fit_alone():
    costs = StepCost()
    costs.observe(1, [], 0.005)
    for length in (1, 2, 4, 8, 16):  # time grows with tokens only; positions grow too, but explain less
        costs.observe(1, [(0, length)], 0.005 + 0.001 * length)
    costs.observe(1, [(2000, 1)], 0.005 + 0.0005)  # one far token that cost less than the rest
    per_token, per_position = costs.figures()
    assert per_token > 0 and per_position >= 0


def test_the_longest_chunk_fits_the_allowance_and_is_at_least_one_token():
    costs = StepCost()
    costs.observe(1, [], 0.004)
    for length in (2, 4, 8):
        costs.observe(1, [(0, length)], 0.004 + 0.001 * length + 1e-6 * attended(0, length))
    allowance = 0.006
    for start in (0, 500, 1500):
        n = costs.longest(start, 64, allowance)
        assert costs.chunk_s(start, n) <= allowance + 1e-12
        assert n == 64 or costs.chunk_s(start, n + 1) > allowance
    assert costs.longest(0, 64, 0.0) == 1 and costs.longest(0, 3, 1.0) == 3


def test_each_count_of_decode_rows_has_its_own_time_and_an_unseen_count_is_read_off_the_line():
    costs = StepCost()
    for _ in range(5):
        costs.observe(2, [], 0.004)
        costs.observe(8, [], 0.010)
    assert costs.decode_s(2) == pytest.approx(0.004) and costs.decode_s(8) == pytest.approx(0.010)
    assert costs.decode_s(5) == pytest.approx(0.007) and costs.decode_s(16) == pytest.approx(0.018)
    assert costs.allowance_s(16) == pytest.approx((STALL - 1) * 0.018)
    costs.observe(12, [], 0.011)  # a count seen once: its own median, and the counts past it no lower
    assert costs.decode_s(12) == pytest.approx(0.011) and costs.decode_s(13) >= 0.011


def test_chunks_beside_many_rows_are_measured_against_a_step_of_as_many_rows():
    """A class arriving together: 12 rows decode while newcomers prefill. Measured against the 2-row steps seen
    before, each chunk token would seem to cost what the 10 more rows do."""
    costs = StepCost()
    for rows in (2, 4, 8):
        for _ in range(3):
            costs.observe(rows, [], 0.003 + 0.001 * rows)
    for length in (4, 8, 12, 16, 6):
        costs.observe(12, [(66, length)], 0.003 + 0.001 * 12 + 0.0004 * length)
    per_token, per_position = costs.figures()
    assert per_token + per_position * 70 == pytest.approx(0.0004, rel=0.2)



def test_a_prior_from_the_capacity_probe_stands_in_until_decode_only_steps_are_seen():
    """A class arriving together on a fresh server: every step prefills, so no decode-only step comes to measure
    the chunks against; the probe's figure does, and the costs are known after a few chunk steps."""
    costs = StepCost(prior=lambda rows: 0.002 + 0.001 * rows)
    assert costs.decode_s(4) == pytest.approx(0.006) and not costs.ready
    for n in range(1, SEEN + 1):
        costs.observe(4, [(0, 8 * n)], 0.006 + 0.0005 * 8 * n)
    assert costs.ready and costs.figures()[0] == pytest.approx(0.0005, rel=1e-6)
    costs.observe(4, [], 0.010)  # a decode-only step of its own: measured beats the prior
    assert costs.decode_s(4) == pytest.approx(0.010) and costs.decode_s(8) == pytest.approx(0.010)


def test_in_a_burst_a_step_may_take_up_to_the_capacity_bar_and_never_less_than_alone():
    costs = StepCost()
    for rows, took in ((2, 0.004), (32, 0.060)):
        costs.observe(rows, [], took)
    bar = INTER_TOKEN_S * HEADROOM
    assert costs.allowance_s(2) == pytest.approx((STALL - 1) * 0.004)  # one newcomer: STALL times the step
    assert costs.allowance_s(2, burst=True) == pytest.approx(bar - 0.004)  # several: up to the bar
    assert costs.allowance_s(32, burst=True) == pytest.approx(max((STALL - 1) * 0.060, bar - 0.060))
