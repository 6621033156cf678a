"""The runner compiles each entry point once per shape bucket, picks the smallest bucket that fits, and its
compiled results equal the eager model's."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_model import TOLERANCE, prefill_all, random_weights, tiny_config

from typewriter.model import Transformer
from typewriter.runner import ModelRunner, bucket, power_of_two_buckets

PREFILL, BATCH, KV = (8, 16), (1, 2), (16, 32)


@pytest.fixture(scope="module")
def weights():
    cfg = tiny_config()
    return cfg, random_weights(cfg, seed=11)


def make_runner(cfg, w) -> ModelRunner:
    return ModelRunner(Transformer(cfg, w, slots=2, max_len=32), PREFILL, BATCH, KV)


@pytest.fixture(scope="module")
def runner(weights):
    return make_runner(*weights)


def test_every_function_is_traced_once_per_bucket_however_lengths_and_positions_vary(runner):
    rng = np.random.default_rng(0)
    for n in range(1, 17):
        runner.prefill(n % 2, rng.integers(0, 265, n).tolist())
    for step in range(40):
        rows = 1 + step % 2
        positions = rng.integers(0, 32, rows) if step % 3 else rng.integers(0, 16, rows)
        runner.decode(rng.integers(0, 265, rows).astype(np.int32), positions.astype(np.int32))
    assert runner.tracing_counts() == {
        "prefill/8": 1, "prefill/16": 1,
        "decode/1x16": 1, "decode/1x32": 1, "decode/2x16": 1, "decode/2x32": 1,
    }


def test_calls_use_the_smallest_bucket_that_fits(weights):
    runner = make_runner(*weights)
    runner.prefill(0, [5, 6, 7, 8, 9, 10, 11, 12, 13])  # 9 tokens: the 16 bucket
    runner.decode(np.array([4], np.int32), np.array([9], np.int32))  # one row at position 9: 1 x 16
    assert set(runner.tracing_counts()) == {"prefill/16", "decode/1x16"}
    runner.decode(np.array([4, 5], np.int32), np.array([16, 0], np.int32))  # position 16 needs 17 cached: 2 x 32
    assert set(runner.tracing_counts()) == {"prefill/16", "decode/1x16", "decode/2x32"}


def test_compiled_prefill_and_decode_match_the_eager_model_across_a_cache_bucket_boundary(runner, weights):
    cfg, w = weights
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, 20).tolist()
    expected = prefill_all(Transformer(cfg, w, slots=1, max_len=32), tokens)  # [20, v]
    np.testing.assert_allclose(runner.prefill(1, tokens[:12]), expected[11], atol=TOLERANCE)
    for pos in range(12, 20):  # kv bucket 16 up to position 15, then 32
        got = runner.decode(np.array([0, tokens[pos]], np.int32), np.array([0, pos], np.int32))[1]
        np.testing.assert_allclose(got, expected[pos], atol=TOLERANCE, err_msg=f"position {pos}")


def test_warmup_compiles_every_bucket_and_later_calls_trace_nothing(weights):
    runner = make_runner(*weights)
    seen = []
    runner.warmup(lambda i, n, label: seen.append((i, n, label)))
    counts = runner.tracing_counts()
    assert len(counts) == len(PREFILL) + len(BATCH) * len(KV) and set(counts.values()) == {1}
    assert seen[-1][:2] == (6, 6)  # progress reaches all six
    runner.prefill(0, [1, 2, 3])
    runner.decode(np.array([1, 2], np.int32), np.array([3, 30], np.int32))
    assert runner.tracing_counts() == counts


def test_bucket_picks_the_first_that_holds_n_and_refuses_beyond_the_last():
    assert [bucket(PREFILL, n) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]
    with pytest.raises(ValueError, match="17 exceeds the largest bucket 16"):
        bucket(PREFILL, 17)


def test_power_of_two_buckets_double_and_always_end_at_the_limit():
    assert power_of_two_buckets(1, 4) == (1, 2, 4)
    assert power_of_two_buckets(64, 200) == (64, 128, 200)
    assert power_of_two_buckets(256, 256) == (256,)


def test_runner_refuses_buckets_that_do_not_end_at_the_cache_size(weights):
    model = Transformer(*weights, slots=2, max_len=32)
    with pytest.raises(ValueError, match="buckets must end"):
        ModelRunner(model, PREFILL, BATCH, (16,))
    with pytest.raises(ValueError, match="buckets must end"):
        ModelRunner(model, PREFILL, (1,), KV)
