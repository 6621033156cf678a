"""int8-lite's attention kernel (runners/lite/kernel.py, attention.c): built once per folder, and numpy's attention
where it cannot be built or used, each said in the log."""

from __future__ import annotations

import logging
import os
import signal
import tomllib
from pathlib import Path

import numpy as np
import pytest
from repo import ROOT
from tiny_model import random_weights, tiny_config

from typewriter.runners.lite import kernel
from typewriter.runners.lite.runner import LiteRunner


def test_the_kernel_is_built_once_into_its_folder_and_reused(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "attention-0123456789abcdef.so").write_bytes(b"built from an older attention.c")
    (tmp_path / "kernels" / "kernels-0123456789abcdef.so").write_bytes(b"built from older sources")
    first = kernel.load.__wrapped__(str(tmp_path))
    (built,) = (tmp_path / "kernels").glob("kernels-*.so")
    stamp = built.stat().st_mtime_ns
    second = kernel.load.__wrapped__(str(tmp_path))
    assert first is not None and second is not None
    assert list((tmp_path / "kernels").iterdir()) == [built] and built.stat().st_mtime_ns == stamp


def test_without_a_compiler_attention_runs_in_numpy_and_the_log_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc here
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert kernel.load.__wrapped__(str(tmp_path)) is None
    assert "no C compiler" in caplog.text and "numpy" in caplog.text


def test_a_kernel_that_does_not_build_is_named_in_the_log(tmp_path, monkeypatch, caplog):
    (tmp_path / "attention.c").write_text("this is not C;\n")
    for name in kernel.SOURCES:
        if name != "attention.c":
            (tmp_path / name).write_bytes((kernel.SOURCE_DIR / name).read_bytes())
    monkeypatch.setattr(kernel, "SOURCE_DIR", tmp_path)
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        assert kernel.load.__wrapped__(str(tmp_path / "cache")) is None
    assert "did not build" in caplog.text
    assert not list((tmp_path / "cache" / "kernels").iterdir())  # no half-written library left behind


def test_heads_the_kernel_cannot_take_get_numpy_attention(caplog):
    cfg = tiny_config(dim=32, n_heads=4, n_kv_heads=2)  # 8 channels a head
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        lite = LiteRunner(cfg, random_weights(cfg, seed=3), 1, 64, 16)
    assert lite.cache.kernel is None and "multiple of 16" in caplog.text
    assert np.isfinite(lite.extend(0, 0, [1, 2, 3])).all()


def test_the_kernel_matches_a_float64_reference_at_every_position():
    k, g, e, padded = 2, 3, 32, 64
    rng = np.random.default_rng(0)
    keys, values = (rng.standard_normal((1, k, padded, e)).astype(np.float16) for _ in range(2))  # as cached
    q = rng.standard_normal((5, k, g, e)) * 0.3
    positions = np.array([0, 17, 31, 32, 63])
    tiled = np.ascontiguousarray(keys.reshape(1, k, padded // 16, 16, e).transpose(0, 1, 2, 4, 3))
    out = kernel.load(None).attend(np.ascontiguousarray(q, np.float32), np.zeros(5, np.int64), positions, tiled,
                                   values)
    keys, values = keys.astype(np.float64), values.astype(np.float64)
    for i, p in enumerate(positions):
        scores = np.einsum("hge,hse->hgs", q[i], keys[0, :, :p + 1])
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        expected = np.einsum("hgs,hse->hge", weights / weights.sum(-1, keepdims=True), values[0, :, :p + 1])
        np.testing.assert_allclose(out[i], expected, rtol=1e-5, atol=1e-5)


def test_a_kernel_built_beside_its_source_needs_no_compiler(tmp_path, monkeypatch, caplog):
    """The container image's way: built at image build time (`python -m typewriter.runners.lite.kernel`), none at run."""
    for name in kernel.SOURCES:
        (tmp_path / name).write_bytes((kernel.SOURCE_DIR / name).read_bytes())
    monkeypatch.setattr(kernel, "SOURCE_DIR", tmp_path)
    kernel.main()
    (built,) = tmp_path.glob("kernels-*.so")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no cc from here on
    with caplog.at_level(logging.WARNING, logger="typewriter.lite"):
        loaded = kernel.load.__wrapped__(str(tmp_path / "cache"))
    assert loaded is not None and not caplog.text and not (tmp_path / "cache").exists()
    assert "kernels-" in built.name


def test_a_slot_or_position_outside_the_cache_is_refused_before_the_kernel_touches_memory():
    k, g, e = 2, 2, 16
    keys, values = np.zeros((2, k, 2, e, 16), np.float16), np.zeros((2, k, 32, e), np.float16)
    q = np.zeros((1, k, g, e), np.float32)
    loaded = kernel.load(None)
    for slot, position in ((2, 0), (-1, 0), (0, 32), (0, -1)):
        with pytest.raises(IndexError, match="outside the cache"):
            loaded.attend(q, np.array([slot]), np.array([position]), keys, values)
        with pytest.raises(IndexError, match="outside the cache"):
            loaded.write(np.zeros((1, (k * g + 2 * k) * e), np.float32), np.array([slot]), np.array([position]),
                         (k * g, k, e), (np.zeros((32, e // 2), np.float32),) * 2, keys, values)
    with pytest.raises(ValueError, match="float16"):
        loaded.attend(q, np.array([0]), np.array([0]), keys.astype(np.float32), values)


def test_the_avx512_routine_gives_the_bits_of_the_avx2_one_where_the_cpu_has_it():
    """A machine's answers must not depend on which routine ran: both add the same products in the same order."""
    k, g, e, padded = 3, 3, 64, 2048
    rng = np.random.default_rng(2)
    keys = (rng.standard_normal((2, k, padded // 16, e, 16)) * 0.5).astype(np.float16)
    values = rng.standard_normal((2, k, padded, e)).astype(np.float16)
    calls = [(np.zeros(t, np.int64) + slot, np.arange(start, start + t)) for t, start, slot in
             ((1, 0, 0), (1, 5, 1), (3, 17, 0), (19, 1565, 1), (64, 1000, 0), (5, 1500, 1), (2, 2040, 0))]
    calls.append((np.array([0, 1, 1, 0]), np.array([900, 33, 34, 7])))  # decode rows of two slots
    queries = [(rng.standard_normal((len(s), k, g, e)) * 0.3).astype(np.float32) for s, _ in calls]
    loaded = kernel.load(None)
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    try:
        runs = {}
        for wide in (False, True):
            loaded.set_wide(wide)
            runs[wide] = [loaded.attend(q, s, p, keys, values) for q, (s, p) in zip(queries, calls)]
        assert loaded.wide == all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl"))
    finally:
        loaded.set_wide(True)
    for narrow, wide in zip(runs[False], runs[True]):
        np.testing.assert_array_equal(narrow, wide)


def _calls(rng, k, g, e, padded):
    keys = (rng.standard_normal((2, k, padded // 16, e, 16)) * 0.5).astype(np.float16)
    values = rng.standard_normal((2, k, padded, e)).astype(np.float16)
    calls = [(np.zeros(t, np.int64) + slot, np.arange(start, start + t)) for t, start, slot in
             ((1, 0, 0), (1, 1500, 1), (19, 1565, 1), (64, 1000, 0), (5, 30, 1))]
    calls.append((np.array([0, 1, 1, 1, 0]), np.array([900, 33, 34, 35, 1900])))  # decode rows and a chunk
    return keys, values, calls, [(rng.standard_normal((len(s), k, g, e)) * 0.3).astype(np.float32) for s, _ in calls]


@pytest.mark.parametrize("wide", [False, True])
def test_a_call_shared_with_the_helper_thread_gives_the_bits_of_one_thread(wide):
    """Each group of rows is computed alone, whichever thread takes it: sharing changes the time, not the bits."""
    keys, values, calls, queries = _calls(np.random.default_rng(4), 3, 3, 64, 2048)
    loaded = kernel.load(None)
    try:
        loaded.set_wide(wide)
        alone = [loaded.attend(q, s, p, keys, values, threads=1) for q, (s, p) in zip(queries, calls)]
        loaded.split_from(0)  # every call shared, however small
        for _ in range(20):  # the helper asleep and woken, or still spinning, in turn
            for q, (s, p), expected in zip(queries, calls, alone):
                np.testing.assert_array_equal(loaded.attend(q, s, p, keys, values, threads=2), expected)
    finally:
        loaded.set_wide(True)
        loaded.split_from(None)


def test_a_forked_child_shares_its_calls_and_finishes_them():
    """A process that forks (a test's, a supervisor's) after the helper started: its child has no helper thread
    until it starts its own, and must neither wait for the parent's nor answer other bits."""
    keys, values, calls, queries = _calls(np.random.default_rng(5), 3, 3, 64, 2048)
    loaded = kernel.load(None)
    loaded.split_from(0)
    try:
        expected = [loaded.attend(q, s, p, keys, values, threads=2) for q, (s, p) in zip(queries, calls)]  # started
        pid = os.fork()
        if pid == 0:  # the child: a deadlock ends by the alarm, a wrong answer by exit status 1
            signal.alarm(30)
            same = all(np.array_equal(loaded.attend(q, s, p, keys, values, threads=2), x)
                       for q, (s, p), x in zip(queries, calls, expected))
            os._exit(0 if same else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child ended with status {status:#x}"
    finally:
        loaded.split_from(None)


def test_every_kernel_source_ships_in_the_package():
    """A wheel (not an editable install) holds only the package data: a source left out would fail every build."""
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert set(kernel.SOURCES) <= set(package["typewriter.runners.lite"])
