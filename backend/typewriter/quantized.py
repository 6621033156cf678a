"""Weight formats of the model's matrices: fp32, or int8 with one scale per output column (`Int8Matrix`).

An int8 matmul quantizes its input too, one scale per row (llama.cpp also quantizes activations to 8 bits), and
multiplies int8 by int8 into int32: that is XLA's fast CPU dot, where int8 weights cast to float first ran 6x
slower than fp32 and blockwise scales (llama.cpp's) 10x, at the model's shapes. A one-row input is padded to two
rows: XLA's one-row int8 dot is a slow loop (5x the two-row call).

One scale per row loses what a few large channels leave to the rest: KL from fp32 0.034 nats a token on
bench/data/heldout.txt. So both sides are rotated first (as QuaRot does): x @ w = (x @ R) @ (R^T @ w) for an
orthogonal R, which spreads a large channel over all of them. R = A (x) H, a random orthogonal A over blocks and
a Hadamard H inside each block of up to 64 channels, costs two small matmuls a call; KL 0.0043 (bench/quality.py).

Only the model (and its families) imports this; which format a matrix gets is the caller's choice (`matrix(..., fmt)`).
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from . import native_ops
from .config import WEIGHT_FORMATS as FORMATS
from .host_memory import variable

INT8_MAX = 127.0


def _hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


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
        """The one Rotation of n channels, shared by every matrix with n inputs."""
        return Rotation(n)

    def numpy(self, x: np.ndarray) -> np.ndarray:
        y = x.reshape(-1, self.a, self.b) @ self.inner
        if self.outer is not None:
            y = np.einsum("mij,ik->mkj", y, self.outer)
        return y.reshape(x.shape)

    def __call__(self, rows: tf.Tensor) -> tf.Tensor:
        """rows [m, n] -> rows @ R"""
        y = tf.reshape(rows, [-1, self.a, self.b]) @ self.inner
        if self.outer is not None:
            y = tf.einsum("mij,ik->mkj", y, self.outer)
        return tf.reshape(y, tf.shape(rows))

    def inverse(self, rows: tf.Tensor) -> tf.Tensor:
        """rows [m, n] -> rows @ R^T (R is orthogonal)"""
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


class Int8Matrix(tf.Module):
    """A [in, out] matrix w held rotated, R^T @ w (see Rotation), as int8 values and a float32 scale per output
    column."""

    def __init__(self, w: np.ndarray, name: str):
        super().__init__(name=name)
        w = np.asarray(w, dtype=np.float32)
        self.rotation = Rotation.of(w.shape[0])
        q, scale = quantize_int8(self.rotation.numpy(w.T).T)  # R^T @ w = (w^T @ R)^T
        self.q = variable(q, f"{name}_q")
        self.scale = variable(scale, f"{name}_scale")

    @property
    def shape(self) -> tf.TensorShape:
        return self.q.shape


def matrix(w: np.ndarray, name: str, fmt: str):
    """w [in, out] in the weight format `fmt` (one of FORMATS)."""
    if fmt == "int8":
        return Int8Matrix(w, name)
    if fmt == "fp32":
        return variable(w, name, np.float32)
    raise ValueError(f"unknown weight format {fmt!r}; one of {', '.join(FORMATS)}")


def dense(x: tf.Tensor, w) -> tf.Tensor:
    """x [..., in] @ w [in, out] -> [..., out] float32, for either format."""
    if not isinstance(w, Int8Matrix):
        return tf.matmul(x, w)
    lead = tf.shape(x)[:-1]
    rows = tf.reshape(x, [-1, x.shape[-1]])
    one_row = rows.shape[0] == 1
    rows = w.rotation(rows)
    if one_row:
        rows = tf.concat([rows, tf.zeros_like(rows)], axis=0)
    row_scale = tf.reduce_max(native_ops.abs(rows), axis=-1, keepdims=True) / INT8_MAX  # [m, 1]
    row_scale = tf.where(row_scale > 0, row_scale, 1.0)
    rows_q = tf.cast(tf.clip_by_value(tf.round(rows / row_scale), -INT8_MAX, INT8_MAX), tf.int8)
    y = tf.cast(tf.linalg.matmul(rows_q, w.q, output_type=tf.int32), tf.float32) * row_scale * w.scale
    if one_row:
        y = y[:1]
    return tf.reshape(y, tf.concat([lead, [w.shape[1]]], axis=0))


def columns(w, index: tf.Tensor) -> tf.Tensor:
    """Columns `index` [...] of w [in, out] as float32 [in, ...] (the tied embedding table's rows)."""
    if not isinstance(w, Int8Matrix):
        return tf.gather(w, index, axis=1)
    rotated = tf.cast(tf.gather(w.q, index, axis=1), tf.float32) * tf.gather(w.scale, index)  # R^T @ w[:, index]
    flat = tf.reshape(tf.transpose(rotated, [*range(1, rotated.shape.rank), 0]), [-1, w.shape[0]])  # [.., in]
    unrotated = w.rotation.inverse(flat)  # w[:, index]^T
    return tf.transpose(tf.reshape(unrotated, tf.concat([tf.shape(index), [w.shape[0]]], 0)),
                        [rotated.shape.rank - 1, *range(rotated.shape.rank - 1)])
