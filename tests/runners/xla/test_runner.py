"""The runner compiles each entry point once per shape bucket, picks the smallest bucket that fits, and its
compiled results equal the eager model's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from repo import TESTS
from tiny_model import TOLERANCE, prefill_all, random_weights, tiny_config

from typewriter.runners.xla.compiler import bucket, power_of_two_buckets
from typewriter.runners.xla.model import Transformer
from typewriter.runners.xla.runner import XlaRunner

CHUNK, BATCH, KV = (8, 16), (1, 2), (16, 32)


@pytest.fixture(scope="module")
def weights():
    cfg = tiny_config()
    return cfg, random_weights(cfg, seed=11)


def make_runner(cfg, w) -> XlaRunner:
    return XlaRunner(Transformer(cfg, w, slots=2, max_len=32, max_chunk=16, kv_buckets=KV), CHUNK, BATCH)


@pytest.fixture(scope="module")
def runner(weights):
    return make_runner(*weights)


def test_every_function_is_traced_once_per_bucket_however_lengths_and_positions_vary(runner):
    rng = np.random.default_rng(0)
    for n in range(1, 17):
        runner.extend(n % 2, (3 * n) % 16, rng.integers(0, 265, n).tolist())
    for step in range(40):
        rows = 1 + step % 2
        positions = rng.integers(0, 32, rows) if step % 3 else rng.integers(0, 16, rows)
        runner.decode(list(range(rows)), rng.integers(0, 265, rows).tolist(), positions.tolist())
    assert runner.compiler.tracing_counts() == {
        "prefill/8x16": 1, "prefill/8x32": 1, "prefill/16x16": 1, "prefill/16x32": 1,
        "decode/1x16": 1, "decode/1x32": 1, "decode/2x16": 1, "decode/2x32": 1,
    }


def test_calls_use_the_smallest_bucket_that_fits(weights):
    runner = make_runner(*weights)
    runner.extend(0, 0, [5, 6, 7, 8, 9, 10, 11, 12, 13])  # 9 tokens from position 0: chunk 16, cache 16
    runner.decode([0], [4], [9])  # one row at position 9: 1 x 16
    assert set(runner.compiler.tracing_counts()) == {"prefill/16x16", "decode/1x16"}
    runner.extend(0, 10, [1, 2, 3])  # 3 tokens after 10 cached: chunk 8, and 13 positions fit in 16
    runner.decode([0, 1], [4, 5], [16, 0])  # position 16 needs 17 cached: 2 x 32
    assert set(runner.compiler.tracing_counts()) == {"prefill/16x16", "prefill/8x16", "decode/1x16", "decode/2x32"}


def test_a_prompt_prefilled_in_chunks_then_decoded_matches_the_eager_model_across_a_cache_boundary(runner, weights):
    cfg, w = weights
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, 24).tolist()
    expected = prefill_all(Transformer(cfg, w, slots=1, max_len=32), tokens)  # [24, v]
    for start, end in ((0, 5), (5, 14), (14, 18)):  # chunks of 5, 9 and 4: buckets 8, 16, 8; cache 16, 16, 32
        got = runner.extend(1, start, tokens[start:end])
        np.testing.assert_allclose(got, expected[end - 1], atol=TOLERANCE, err_msg=f"chunk {start}..{end}")
    for pos in range(18, 24):
        got = runner.decode([1], [tokens[pos]], [pos])[0]  # alone in a batch bucket of 1
        np.testing.assert_allclose(got, expected[pos], atol=TOLERANCE, err_msg=f"position {pos}")


def test_a_chunk_at_the_end_of_the_context_drops_its_padding_past_the_cache(runner, weights):
    cfg, w = weights
    tokens = np.random.default_rng(2).integers(0, cfg.vocab_size, 32).tolist()
    expected = prefill_all(Transformer(cfg, w, slots=1, max_len=32), tokens)
    runner.extend(0, 0, tokens[:16])
    runner.extend(0, 16, tokens[16:30])
    got = runner.extend(0, 30, tokens[30:])  # positions 30, 31, then padding at 32..37, dropped
    np.testing.assert_allclose(got, expected[31], atol=TOLERANCE)


def test_a_copied_slot_continues_exactly_as_the_original(runner, weights):
    cfg, w = weights
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, 12).tolist()
    expected = prefill_all(Transformer(cfg, w, slots=1, max_len=32), tokens)
    runner.extend(0, 0, tokens[:10])
    runner.extend(1, 0, [7] * 16)  # slot 1 holds something else first
    runner.copy_slot(0, 1)
    got = runner.extend(1, 10, tokens[10:])  # only the two new tokens are computed
    np.testing.assert_allclose(got, expected[11], atol=TOLERANCE)


def test_warmup_compiles_every_bucket_and_later_calls_trace_nothing(weights):
    runner = make_runner(*weights)
    seen = []
    runner.compiler.warmup(lambda i, n, label: seen.append((i, n, label)))
    counts = runner.compiler.tracing_counts()
    n = len(CHUNK) * len(KV) + len(BATCH) * len(KV) + 1  # and the cache copy
    assert len(counts) == n and set(counts.values()) == {1}
    assert seen[-1][:2] == (n, n)
    runner.extend(0, 4, [1, 2, 3])
    runner.copy_slot(0, 1)
    runner.decode([0, 1], [1, 2], [3, 30])
    assert runner.compiler.tracing_counts() == counts


def test_bucket_picks_the_first_that_holds_n_and_refuses_beyond_the_last():
    assert [bucket(CHUNK, n) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]
    with pytest.raises(ValueError, match="17 exceeds the largest bucket 16"):
        bucket(CHUNK, 17)


def test_power_of_two_buckets_double_and_always_end_at_the_limit():
    assert power_of_two_buckets(1, 4) == (1, 2, 4)
    assert power_of_two_buckets(64, 200) == (64, 128, 200)
    assert power_of_two_buckets(256, 256) == (256,)


def test_runner_refuses_buckets_that_do_not_fit_the_cache(weights):
    model = Transformer(*weights, slots=2, max_len=32, max_chunk=16, kv_buckets=KV)
    with pytest.raises(ValueError, match="batch buckets must end"):
        XlaRunner(model, CHUNK, (1,))
    with pytest.raises(ValueError, match="chunks within the model's max_chunk"):
        XlaRunner(model, (8, 32), BATCH)
    with pytest.raises(ValueError, match=r"cache segments \(16, 24\) must be positive and end at 32"):
        Transformer(*weights, slots=2, max_len=32, kv_buckets=(16, 24))


def test_one_xla_program_serves_every_slot_start_and_copy_pair(runner):
    """A value XLA needs at compile time (a variable sliced at a tensor index) would be baked into the program,
    so each new slot would compile again, for seconds, while requests wait: the lowered HLO must not depend on
    the values, only on the bucket."""
    def hlo(fn, *args):
        return fn.experimental_get_compiler_ir(*args)(stage="hlo")

    chunk = np.zeros([1, 8], np.int32)
    assert hlo(runner.compiler.extend_fn(8, 16), chunk, np.int32(0), np.int32(3), np.int32(0)) == \
        hlo(runner.compiler.extend_fn(8, 16), chunk, np.int32(5), np.int32(2), np.int32(1))
    copy = runner.compiler.fn(("copy", 1, 32))
    assert hlo(copy, np.int32(0), np.int32(1)) == hlo(copy, np.int32(1), np.int32(0))
    rows = np.zeros([2], np.int32)
    assert hlo(runner.compiler.decode_fn(2, 16), rows, rows, np.array([0, 1], np.int32)) == \
        hlo(runner.compiler.decode_fn(2, 16), rows + 3, rows + 4, np.array([1, 0], np.int32))


COMPILE_IN_ORDER = """
import sys
from typewriter.runners.xla.tf_env import prepare_environment
prepare_environment(sys.argv[1])
import numpy as np, tensorflow as tf
from tiny_model import random_weights, tiny_config
from typewriter.runners.xla.model import Transformer
from typewriter.runners.xla.runner import XlaRunner
cfg = tiny_config()
runner = XlaRunner(Transformer(cfg, random_weights(cfg), slots=2, max_len=32, max_chunk=16, kv_buckets=(16, 32)),
                     (8, 16), (1, 2))
tf.constant(np.arange(7)) + 1  # eager work in between advances TensorFlow's naming counter
for key in sys.argv[2:]:
    kind, size, kv_len = key.split(":")
    runner.compiler.compile((kind, int(size), int(kv_len)))
"""


def test_a_program_compiled_in_another_order_after_other_work_is_found_in_the_xla_disk_cache(tmp_path):
    """TensorFlow names traced functions from a process-wide counter, and XLA's disk cache keys programs by
    those names: without the runner's own names, a restart that compiled in another order missed every entry."""
    def compile_in(order: list[str]) -> set[str]:
        env = {k: v for k, v in os.environ.items() if k != "TF_XLA_FLAGS"}  # a CLI test may have set its cache
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *sys.path])
        subprocess.run([sys.executable, "-c", COMPILE_IN_ORDER, str(tmp_path / "xla"), *order], check=True, env=env,
                       timeout=300)
        return set(os.listdir(tmp_path / "xla"))

    first = compile_in(["decode:1:16", "prefill:8:32", "copy:1:32"])
    assert len(first) == 3
    second = compile_in(["prefill:16:16", "copy:1:32", "prefill:8:32", "decode:1:16"])
    assert first < second and len(second) == 4  # the three were found again; only the new one was added


def test_while_the_background_compiles_calls_make_do_with_compiled_programs_and_still_match_the_model(weights):
    cfg, w = weights
    runner = make_runner(cfg, w)
    runner.compiler.compile_all([("prefill", 8, 32), ("decode", 1, 32)])
    first, gate = threading.Event(), threading.Event()

    def hold(done, total, name):  # the background holds after its first program
        first.set()
        gate.wait(60)

    thread = runner.compiler.compile_in_background(hold)
    assert first.wait(60)
    tokens = np.random.default_rng(4).integers(0, cfg.vocab_size, 13).tolist()
    expected = prefill_all(Transformer(cfg, w, slots=1, max_len=32), tokens)
    for slot in (0, 1):
        got = runner.extend(slot, 0, tokens[:12])  # its own program is 16 x 16: made do with two calls of 8 x 32
        np.testing.assert_allclose(got, expected[11], atol=TOLERANCE)
    got = runner.decode([0, 1], [tokens[12]] * 2, [12, 12])  # 2 x 16 is not compiled: two calls of one row
    np.testing.assert_allclose(got, [expected[12]] * 2, atol=TOLERANCE)
    assert not {"prefill/16x16", "decode/2x16"} & set(runner.compiler.tracing_counts())
    assert runner.compiler.status() == {"compiled": 3, "total": len(runner.compiler.programs()), "compiling": []}
    gate.set()
    thread.join(120)
    assert runner.compiler.status() == {"compiled": len(runner.compiler.programs()), "total": len(runner.compiler.programs()),
                                       "compiling": []}
    assert set(runner.compiler.tracing_counts().values()) == {1}


def test_a_prefill_program_alone_serves_decode_rows_until_theirs_compile(weights):
    cfg, w = weights
    runner = make_runner(cfg, w)
    runner.compiler.compile_all([("prefill", 8, 16)])
    started, gate = threading.Event(), threading.Event()
    real_compile = runner.compiler.compile

    def held_compile(key):  # the background is still on its first program
        started.set()
        gate.wait(60)
        real_compile(key)

    runner.compiler.compile = held_compile
    thread = runner.compiler.compile_in_background()
    assert started.wait(60)
    assert runner.compiler.can_run("decode", 2, 14)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, 14).tolist()
    expected = prefill_all(Transformer(cfg, w, slots=1, max_len=32), tokens)
    for slot in (0, 1):
        runner.extend(slot, 0, tokens[:12])
    got = runner.decode([0, 1], [tokens[12]] * 2, [12, 12])  # rows of one-token chunks, K/V written as decode does
    np.testing.assert_allclose(got, [expected[12]] * 2, atol=TOLERANCE)
    got = runner.decode([1], [tokens[13]], [13])  # reads the K/V that the chunk wrote
    np.testing.assert_allclose(got, [expected[13]], atol=TOLERANCE)
    assert set(runner.compiler.tracing_counts()) == {"prefill/8x16"}
    assert runner.compiler._queue[0] == ("decode", 1, 16)  # what the rows lacked compiles next
    assert not runner.compiler.can_run("decode", 1, 20)  # past the compiled program's attention length: its own is needed
    gate.set()
    thread.join(120)
    np.testing.assert_allclose(runner.decode([1], [tokens[13]], [13]), [expected[13]], atol=TOLERANCE)
    assert "decode/1x16" in runner.compiler.tracing_counts()
