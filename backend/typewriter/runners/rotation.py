"""The rotation both sides of an int8 matmul share (xla/quantized.py says why) and per-column int8 rounding, in numpy
for the int8-lite programs to fold into their weights; XLA's int8 also rotates rows in a program, with TensorFlow."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import tensorflow as tf

INT8_MAX = 127.0


def _hadamard(n: int) -> npt.NDArray[np.float64]:
    h: npt.NDArray[np.float64] = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / math.sqrt(n)


def _orthogonal(n: int) -> np.ndarray:
    """A fixed random orthogonal matrix (the same in every process: the weights and inputs must agree)."""
    q, r = np.linalg.qr(np.random.default_rng(n).standard_normal((n, n)))
    return q * np.sign(np.diag(r))


class Rotation:
    """x -> x @ R for x [..., n], R = A (x) H: n = a * b channels as a blocks of b = the largest power of two up
    to 64 that divides n, H (Hadamard) inside each block, A (orthogonal) across them."""

    def __init__(self, n: int):
        self.b = int(np.gcd(n, 64))
        self.a = n // self.b
        self.inner = _hadamard(self.b).astype(np.float32)
        self.outer = _orthogonal(self.a).astype(np.float32) if self.a > 1 else None

    @staticmethod
    @functools.cache
    def of(n: int) -> Rotation:
        return Rotation(n)

    def numpy(self, x: np.ndarray) -> np.ndarray:
        rows = x.size // (self.a * self.b)
        y = (np.ascontiguousarray(x).reshape(-1, self.b) @ self.inner).reshape(rows, self.a, self.b)  # one GEMM
        if self.outer is not None:
            y = np.matmul(self.outer.T, y)  # [a, a] @ [rows, a, b]: each row's blocks mixed
        return y.reshape(x.shape)

    def __call__(self, rows: tf.Tensor) -> tf.Tensor:
        """rows [m, n] -> rows @ R"""
        import tensorflow as tf

        y = tf.reshape(rows, [-1, self.a, self.b]) @ self.inner
        if self.outer is not None:
            y = tf.einsum("mij,ik->mkj", y, self.outer)
        return tf.reshape(y, tf.shape(rows))

    def inverse(self, rows: tf.Tensor) -> tf.Tensor:
        """rows [m, n] -> rows @ R^T (R is orthogonal)"""
        import tensorflow as tf

        y = tf.reshape(rows, [-1, self.a, self.b])
        if self.outer is not None:
            y = tf.einsum("mkj,ik->mij", y, self.outer)
        return tf.reshape(y @ self.inner.T, tf.shape(rows))


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w [in, out] -> (int8 [in, out], float32 scale [out]) with w ~ q * scale, symmetric per output column."""
    w = np.asarray(w, dtype=np.float32)
    scale = np.abs(w).max(axis=0) / INT8_MAX
    scale[scale == 0] = 1.0  # an all-zero column stays zero
    q = np.clip(np.rint(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale.astype(np.float32)
