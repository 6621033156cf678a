"""TensorFlow variables over numpy memory, so each weight is copied once, straight into the model's layout, where
`tf.Variable(array)` copies it three times (docs/measurements/2026-12-02-start-up-and-memory.md). TensorFlow
aborts on a buffer not aligned to 64 bytes, so every array is placed here. A first write makes TensorFlow copy the
buffer into its own, so `zeros_variable` defers rather than saves: the K/V cache costs nothing until written.
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
    """The one copy of `array` (any layout, a transposed view say), which the variable keeps."""
    array = np.asarray(array)
    placed = aligned(array.shape, dtype or array.dtype)
    np.copyto(placed, array, casting="same_kind")
    return _adopt(placed, name)


def zeros_variable(shape: Sequence[int], dtype: npt.DTypeLike, name: str) -> tf.Variable:
    """Its memory is not touched until its first write."""
    return _adopt(aligned(shape, dtype, zeros=True), name)


def _adopt(array: np.ndarray, name: str) -> tf.Variable:
    if array.size == 0:  # DLPack has nothing to share
        return tf.Variable(array, trainable=False, name=name)
    shared = tf.experimental.dlpack.from_dlpack(array.__dlpack__())  # keeps `array` alive
    return tf.Variable(shared, trainable=False, name=name)  # takes the buffer over: no copy
