"""TensorFlow variables over numpy memory, without a copy.

`tf.Variable(array)` copies the array into a tensor, and that into the variable: with the transposes before it,
three copies of each weight (docs/measurements/2026-12-02-start-up-and-memory.md). A variable made from a tensor that
shares an array's memory (through DLPack) keeps that memory instead, so each weight is copied once, straight
into the layout the model wants (the matrices the model joins, q/k/v and gate/up, twice: joined, then placed). TensorFlow requires its buffers aligned to 64 bytes (Eigen's widest vector) and
aborts the process on one that is not, so every array is placed here, never taken as it comes.

The first write to such a variable makes TensorFlow copy the buffer into one of its own (its refcount logic does
not take over foreign memory). So `zeros_variable` defers rather than saves: the K/V cache starts as zero pages
that nobody has touched, and each segment becomes TensorFlow's own at its first write, by the first program that
reaches that length. Making the cache (720 MiB at the defaults) then costs nothing
before the server is ready, whose first programs write only the first segment.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import tensorflow as tf

ALIGN = 64


def aligned(shape: Sequence[int], dtype: npt.DTypeLike, zeros: bool = False) -> np.ndarray:
    """An uninitialized (or zeroed) C-contiguous array whose data starts at a multiple of ALIGN bytes."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (np.zeros if zeros else np.empty)(nbytes + ALIGN, np.uint8)  # large zeros: pages the system zeroes
    start = -raw.ctypes.data % ALIGN
    placed: np.ndarray = raw[start:start + nbytes].view(dtype)
    return placed.reshape(shape)


def variable(array: npt.ArrayLike, name: str, dtype: npt.DTypeLike | None = None) -> tf.Variable:
    """A variable holding a copy of `array` (any layout, a transposed view say, converted to `dtype`): the one
    copy, which the variable keeps. The caller's array stays its own."""
    array = np.asarray(array)
    placed = aligned(array.shape, dtype or array.dtype)
    np.copyto(placed, array, casting="same_kind")
    return _adopt(placed, name)


def zeros_variable(shape: Sequence[int], dtype: npt.DTypeLike, name: str) -> tf.Variable:
    """A zero variable whose memory is not touched until its first write (see above)."""
    return _adopt(aligned(shape, dtype, zeros=True), name)


def _adopt(array: np.ndarray, name: str) -> tf.Variable:
    if array.size == 0:  # DLPack has nothing to share
        return tf.Variable(array, trainable=False, name=name)
    shared = tf.experimental.dlpack.from_dlpack(array.__dlpack__())  # keeps `array` alive
    return tf.Variable(shared, trainable=False, name=name)  # takes the buffer over: no copy
