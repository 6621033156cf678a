import numpy as np
import pytest

from typewriter.engine.request import SamplingParams
from typewriter.engine.sampling import Sampler, Seen

VOCAB = 49152


def params(**kw):
    base = dict(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0, seed=0)
    return SamplingParams(**{**base, **kw})


def draws(sampler, logits, n, history=()):
    return np.array([sampler.sample(logits, Seen(history)) for _ in range(n)])


@pytest.fixture
def big_logits():
    return np.random.default_rng(42).normal(0, 3, size=(5, VOCAB)).astype(np.float32)  # [rows, vocab]


def test_greedy_picks_the_argmax():
    logits = np.array([0.1, 2.5, -1.0, 2.4], dtype=np.float32)
    assert Sampler(params(temperature=0.0)).sample(logits, Seen()) == 1


def test_greedy_breaks_ties_towards_the_lowest_id():
    logits = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)
    assert Sampler(params(temperature=0.0)).sample(logits, Seen()) == 1


def test_the_same_seed_gives_the_same_tokens(big_logits):
    a, b = Sampler(params(seed=123, top_k=50, top_p=0.95)), Sampler(params(seed=123, top_k=50, top_p=0.95))
    assert [a.sample(row, Seen()) for row in big_logits] * 3 == [b.sample(row, Seen()) for row in big_logits] * 3
    seq_a = draws(Sampler(params(seed=5)), big_logits[0], 30)
    seq_b = draws(Sampler(params(seed=5)), big_logits[0], 30)
    assert (seq_a == seq_b).all()


def test_different_seeds_give_different_tokens(big_logits):
    flat = big_logits[0] * 0.01  # a nearly flat distribution: collisions would be a fluke
    assert (draws(Sampler(params(seed=1)), flat, 20) != draws(Sampler(params(seed=2)), flat, 20)).any()


def test_top_k_of_one_equals_greedy(big_logits):
    greedy, top1 = Sampler(params(temperature=0.0)), Sampler(params(top_k=1, temperature=1.5))
    for row in big_logits:
        assert top1.sample(row, Seen()) == greedy.sample(row, Seen()) == int(np.argmax(row))


def test_a_tiny_top_p_equals_greedy(big_logits):
    greedy, nucleus = Sampler(params(temperature=0.0)), Sampler(params(top_p=1e-6))
    for row in big_logits:
        assert nucleus.sample(row, Seen()) == greedy.sample(row, Seen())


def test_top_k_only_ever_draws_the_k_best():
    logits = np.log(np.array([0.05, 0.4, 0.1, 0.3, 0.15]))
    assert set(draws(Sampler(params(top_k=2)), logits, 2000).tolist()) == {1, 3}


def test_top_p_keeps_the_smallest_set_reaching_p_and_renormalises():
    logits = np.log(np.array([0.15, 0.5, 0.05, 0.3]))
    got = draws(Sampler(params(top_p=0.75)), logits, 4000)
    assert set(got.tolist()) == {1, 3}  # 0.5 alone is short of 0.75; 0.5 + 0.3 reaches it
    assert np.mean(got == 1) == pytest.approx(0.5 / 0.8, abs=0.03)


def test_top_p_grows_its_candidates_until_they_hold_p_of_the_mass():
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[:1000] = 5.0  # 1000 ids hold about 75% of the mass, the other 48152 the rest
    got = draws(Sampler(params(top_p=0.7)), logits, 2000)
    assert got.max() < 1000
    assert len(set(got.tolist())) > 512  # more candidates than the first guesses of 64 and 512


def test_draws_follow_the_softmax_over_many_samples():
    logits = np.array([1.0, 0.0, 2.0, -1.0, 0.5], dtype=np.float32)
    expected = np.exp(logits) / np.exp(logits).sum()
    got = np.bincount(draws(Sampler(params(seed=9)), logits, 20000), minlength=5) / 20000
    np.testing.assert_allclose(got, expected, atol=0.015)


def test_temperature_sharpens_the_distribution():
    logits = np.array([1.0, 0.0, 2.0, -1.0, 0.5], dtype=np.float32)
    expected = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    got = np.bincount(draws(Sampler(params(seed=3, temperature=0.5)), logits, 20000), minlength=5) / 20000
    np.testing.assert_allclose(got, expected, atol=0.015)


def test_repetition_penalty_divides_a_repeated_positive_logit():
    logits = np.array([1.0, 1.5, 0.2], dtype=np.float32)
    assert Sampler(params(temperature=0.0)).sample(logits, Seen([1])) == 1
    assert Sampler(params(temperature=0.0, repetition_penalty=2.0)).sample(logits, Seen([1, 1, 1])) == 0  # 1.5 -> 0.75


def test_repetition_penalty_multiplies_a_repeated_negative_logit():
    logits = np.array([-1.0, -0.6, -5.0], dtype=np.float32)
    assert Sampler(params(temperature=0.0, repetition_penalty=2.0)).sample(logits, Seen([1])) == 0  # -0.6 -> -1.2


def test_repetition_penalty_lowers_how_often_a_repeated_token_is_drawn():
    logits = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    plain = np.mean(draws(Sampler(params(seed=4)), logits, 3000, history=[2]) == 2)
    penalised = np.mean(draws(Sampler(params(seed=4, repetition_penalty=3.0)), logits, 3000, history=[2]) == 2)
    assert plain == pytest.approx(1 / 3, abs=0.03)
    assert penalised == pytest.approx(np.exp(1 / 3) / (2 * np.e + np.exp(1 / 3)), abs=0.03)  # logit 1 -> 1/3


def test_sampling_leaves_the_callers_logits_untouched(big_logits):
    row = big_logits[0].copy()
    Sampler(params(repetition_penalty=1.3, top_k=10)).sample(row, Seen([int(np.argmax(row))]))
    np.testing.assert_array_equal(row, big_logits[0])


def test_sampling_leaves_a_float64_row_untouched_too():
    row = np.random.default_rng(8).normal(0, 2, 300)
    before = row.copy()
    for temperature in (0.0, 0.8):
        Sampler(params(temperature=temperature, repetition_penalty=1.5)).sample(row, Seen(range(0, 300, 3)))
    np.testing.assert_array_equal(row, before)


def reference_greedy(row: np.ndarray, history: list[int], penalty: float) -> int:
    """The penalised float64 copy's first maximum, as sampling.py defined greedy before it avoided the copy."""
    logits = np.array(row, dtype=np.float64)
    seen = np.unique(np.asarray(history, dtype=np.int64))
    seen = seen[(seen >= 0) & (seen < logits.size)]
    values = logits[seen]
    logits[seen] = np.where(values > 0, values / penalty, values * penalty)
    return int(np.argmax(logits))


def test_greedy_with_a_penalty_picks_what_the_penalised_float64_copy_does():
    """Ties between a seen and an unseen id, a seen maximum, masked rows, NaN, penalties above and below 1 and ids
    past the row's end: the same token as the copy's argmax, every time."""
    rng = np.random.default_rng(11)
    for case in range(3000):
        size = int(rng.integers(1, 60))
        row = rng.choice([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0], size).astype(np.float32)  # many ties
        if case % 5 == 0:
            row[rng.random(size) < 0.6] = -np.inf  # a constraint's mask
        if case % 97 == 0:
            row[int(rng.integers(size))] = np.nan
        if case % 7 == 0:
            row = rng.normal(0, 3, size).astype(np.float32)
        history = [int(t) for t in rng.integers(-2, size + 3, int(rng.integers(0, size + 4)))]
        penalty = float(rng.choice([0.5, 0.9, 1.1, 1.3, 2.0, 3.0, 10.0]))
        got = Sampler(params(temperature=0.0, repetition_penalty=penalty)).sample(row, Seen(history))
        assert got == reference_greedy(row, history, penalty), (case, row, history, penalty)


def test_seen_keeps_each_id_once_ascending_and_never_a_negative_one():
    seen = Seen([5, 3, 5, -1, 9, 3])
    for token_id in [1, 9, 40, 2, 1] + list(range(100, 140)):
        seen.add(token_id)
    assert seen.ids.tolist() == [1, 2, 3, 5, 9, 40, *range(100, 140)]
    assert len(seen) == 46 and 40 in seen and -1 not in seen and 4 not in seen


def test_greedy_masks_a_writeable_row_only_for_a_moment_and_reads_a_read_only_one():
    """The best unseen id is found with the seen ones masked: in the caller's row, put back before returning, or in a
    copy where the row cannot be written."""
    row = np.array([0.5, 3.0, 2.0, 2.9, -1.0], dtype=np.float32)  # its maximum, id 1, was said before
    before = row.copy()
    sampler = Sampler(params(temperature=0.0, repetition_penalty=2.0))
    assert sampler.sample(row, Seen([1, 4])) == 3  # 3.0 -> 1.5; the best unseen is 2.9
    np.testing.assert_array_equal(row, before)
    row.flags.writeable = False
    assert sampler.sample(row, Seen([1, 4])) == 3
    assert sampler.sample(row, Seen([1, 3])) == 2  # 3.0 -> 1.5 and 2.9 -> 1.45 both under 2.0
