"""Variables over numpy memory: aligned as TensorFlow requires, one copy that the caller cannot disturb, and
compiled programs that read it in place."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import pytest
import tensorflow as tf

from typewriter.runners.xla.host_memory import ALIGN, aligned, variable, zeros_variable


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_bytes_from_now() -> Callable[[], int]:
    """Resets this process's peak resident size (Linux's clear_refs 5); returns a reader of the peak since."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

    def peak() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))

    return peak


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int32])
@pytest.mark.parametrize("zeros", [False, True])
def test_aligned_arrays_start_on_the_boundary_tensorflow_checks(dtype, zeros):
    for n in (1, 3, 1000, 12345):
        a = aligned((n, 3), dtype, zeros=zeros)
        assert a.shape == (n, 3) and a.dtype == dtype and a.flags.c_contiguous
        assert a.ctypes.data % ALIGN == 0
        if zeros:
            assert not a.any()


def test_a_variable_holds_a_copy_in_the_asked_layout_and_type():
    source = np.arange(24, dtype=np.float64).reshape(4, 6)
    v = variable(source.T, "t", np.float32)  # a transposed view, converted
    assert v.dtype == tf.float32 and v.shape == (6, 4)
    np.testing.assert_array_equal(v.numpy(), source.T.astype(np.float32))
    source[0, 0] = -1.0  # the caller's array stays its own, both ways
    v.assign_add(tf.ones_like(v))
    assert v.numpy()[0, 0] == 1.0 and source[0, 0] == -1.0
    np.testing.assert_array_equal(variable(np.zeros((0, 3)), "empty", np.float32).numpy(), np.zeros((0, 3)))


def test_a_variable_is_one_copy_and_a_compiled_read_of_it_makes_none():
    size = 256 << 20
    source = np.ones([size // 4 // 1024, 1024], np.float32)
    before = resident_bytes()
    peak = peak_bytes_from_now()
    v = variable(source.T, "weights", np.float32)
    grew = resident_bytes() - before
    assert 0.9 * size < grew < 1.25 * size
    assert peak() - before < 1.25 * size  # written once in its layout, never also converted, then copied again
    column_sums = tf.function(lambda: tf.reduce_sum(v, axis=1), jit_compile=True)
    assert float(column_sums()[5]) == source.shape[0]
    assert resident_bytes() - before - grew < size // 4  # the compile's own memory, not a copy of v


def test_a_zero_variable_takes_no_memory_until_written_and_then_keeps_what_was_written():
    size = 256 << 20
    before = resident_bytes()
    v = zeros_variable([size // 4 // 1024, 1024], np.float32, "cache")
    assert resident_bytes() - before < size // 8  # nothing touched yet
    assert float(tf.function(lambda: tf.reduce_sum(v), jit_compile=True)()) == 0.0
    assert resident_bytes() - before < size // 8  # reading it touches nothing either

    @tf.function(jit_compile=True)
    def write():  # returns nothing, as the model's cache writes (a returned value would be a copy of it all)
        v.scatter_nd_update([[7]], tf.fill([1, 1024], 2.5))

    write()
    write()
    assert float(tf.reduce_sum(v)) == 2.5 * 1024 and float(v[7, 3]) == 2.5 and float(v[8, 3]) == 0.0
