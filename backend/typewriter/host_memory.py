"""TensorFlow variables over numpy memory, without a copy.

`tf.Variable(array)` copies the array into a tensor and then, here, took 1.7 s for the embedded model's 513 MiB
of weights and 1.3 s to fill 720 MiB of K/V cache with zeros. A variable made from a tensor that shares an
array's memory (through DLPack) keeps that memory instead: each weight is copied once, straight into the layout
the model wants, and the cache starts as zero pages that the system hands out only when a position is first
written, so an idle slot costs no memory. TensorFlow requires its buffers aligned to 64 bytes (Eigen's widest
vector) and aborts the process on one that is not, so every array is placed here, never taken as it comes.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

ALIGN = 64


def aligned(shape, dtype, zeros: bool = False) -> np.ndarray:
    """An uninitialized (or zeroed, lazily by the system) C-contiguous array whose data starts at ALIGN bytes."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = (np.zeros if zeros else np.empty)(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def variable(array: np.ndarray, name: str, dtype=None) -> tf.Variable:
    """A variable holding a copy of `array` (any layout, a transposed view say, converted to `dtype`): the one
    copy, which the variable keeps. The caller's array stays its own."""
    array = np.asarray(array)
    placed = aligned(array.shape, dtype or array.dtype)
    np.copyto(placed, array, casting="same_kind")
    return _adopt(placed, name)


def zeros_variable(shape, dtype, name: str) -> tf.Variable:
    """A zero variable whose pages are taken from the system only as they are written."""
    return _adopt(aligned(shape, dtype, zeros=True), name)


def _adopt(array: np.ndarray, name: str) -> tf.Variable:
    if array.size == 0:  # DLPack has nothing to share
        return tf.Variable(array, trainable=False, name=name)
    shared = tf.experimental.dlpack.from_dlpack(array.__dlpack__())  # keeps `array` alive
    return tf.Variable(shared, trainable=False, name=name)
